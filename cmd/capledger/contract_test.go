package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// The tests of this file are the documentation's outside client: they run
// the real binary (`capledger serve`, embedded store, no configuration) on
// a loopback port and speak plain HTTP/JSON to it, checking what
// README.md and docs/API.md promise a gateway author in another language,
// word for word where the docs quote an answer.

// contractAnswer is one HTTP answer as a client sees it.
type contractAnswer struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// contractCall sends one request to the server at base: method is a
// LedgerService method, or "Service/Method" of another capledger.v1
// service. body is sent as it is (a nil header map sends
// Content-Type: application/json).
func contractCall(t *testing.T, base, httpMethod, method string, body []byte, header map[string]string) contractAnswer {
	t.Helper()
	path := "/capledger.v1.LedgerService/" + method
	if strings.Contains(method, "/") {
		path = "/capledger.v1." + method
	}
	if strings.HasPrefix(method, "/") {
		path = method
	}
	req, err := http.NewRequest(httpMethod, base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", httpMethod, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", httpMethod, path, err)
	}
	a := contractAnswer{status: resp.StatusCode, header: resp.Header, raw: raw}
	json.Unmarshal(raw, &a.body)
	return a
}

// reason is the answer's first detail's debug.reason ("" when none).
func (a contractAnswer) reason() string {
	details, _ := a.body["details"].([]any)
	if len(details) == 0 {
		return ""
	}
	d, _ := details[0].(map[string]any)
	debug, _ := d["debug"].(map[string]any)
	r, _ := debug["reason"].(string)
	return r
}

func (a contractAnswer) str(key string) string {
	s, _ := a.body[key].(string)
	return s
}

// TestContractReadmeCurlExamples runs the README's "Five minutes with
// curl" calls literally (the port changed), in order, against a fresh
// server, and compares each answer with the output the README shows:
// times, the Date header and the spaces protojson adds at random are the
// only things allowed to differ (and the balances by what refill minted,
// which the README says too).
func TestContractReadmeCurlExamples(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "## Five minutes with curl")
	end := strings.Index(section, "## Rules for gateways")
	if start < 0 || end < start {
		t.Fatal(`README.md: no "Five minutes with curl" section before "Rules for gateways"`)
	}
	examples := readmeCurlExamples(t, section[start:end])
	if len(examples) < 10 {
		t.Fatalf("README.md: found %d curl examples; the section has 11", len(examples))
	}
	for i, ex := range examples {
		got := ex.run(t, srv.url)
		if normalizeAnswer(got) == normalizeAnswer(ex.output) {
			continue
		}
		if ex.isGetAccount && sameAccountsButMinted(t, got, ex.output) {
			continue
		}
		t.Errorf("README example %d (%s):\nthe README shows:\n%s\nthe server answers:\n%s", i+1, ex.summary, ex.output, got)
	}
}

// curlExample is one `$ curl ...` of the README and the output shown
// under it.
type curlExample struct {
	summary      string
	include      bool // -i: the status line and headers are shown
	get          bool // -G: --data-urlencode goes into the query
	path         string
	headers      [][2]string
	body         string
	query        url.Values
	output       string
	isGetAccount bool
}

// readmeCurlExamples parses the fenced blocks of section that start with
// "$ curl": each command (continued while a single quote is open or a
// line ends in a backslash) and the lines after it up to the next "$ ".
func readmeCurlExamples(t *testing.T, section string) []curlExample {
	t.Helper()
	var out []curlExample
	fence := regexp.MustCompile("(?ms)^```[a-z]*\n(.*?)^```")
	for _, block := range fence.FindAllStringSubmatch(section, -1) {
		text := block[1]
		if !strings.HasPrefix(text, "$ curl") {
			continue
		}
		lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
		for i := 0; i < len(lines); {
			if !strings.HasPrefix(lines[i], "$ curl") {
				i++
				continue
			}
			cmd := []string{strings.TrimPrefix(lines[i], "$ ")}
			i++
			for strings.HasSuffix(cmd[len(cmd)-1], "\\") || strings.Count(strings.Join(cmd, "\n"), "'")%2 == 1 {
				cmd = append(cmd, lines[i])
				i++
			}
			var output []string
			for i < len(lines) && !strings.HasPrefix(lines[i], "$ ") {
				output = append(output, lines[i])
				i++
			}
			out = append(out, parseCurl(t, strings.Join(cmd, "\n"), strings.TrimSpace(strings.Join(output, "\n"))))
		}
	}
	return out
}

// parseCurl reads the few curl options the README uses: -s, -i, -G, -H,
// -d and --data-urlencode, each argument a word or a single-quoted string.
func parseCurl(t *testing.T, cmd, output string) curlExample {
	t.Helper()
	var words []string
	rest := strings.ReplaceAll(cmd, "\\\n", " ")
	for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimSpace(rest) {
		if rest[0] == '\'' {
			end := strings.IndexByte(rest[1:], '\'')
			if end < 0 {
				t.Fatalf("README: unterminated quote in %q", cmd)
			}
			words = append(words, rest[1:1+end])
			rest = rest[2+end:]
			continue
		}
		end := strings.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		words = append(words, rest[:end])
		rest = rest[end:]
	}
	ex := curlExample{summary: strings.SplitN(cmd, "\n", 2)[0], output: output, query: url.Values{}}
	for i := 1; i < len(words); i++ {
		switch w := words[i]; {
		case w == "-s":
		case w == "-si" || w == "-is":
			ex.include = true
		case w == "-G":
			ex.get = true
		case w == "-H":
			i++
			name, value, _ := strings.Cut(words[i], ":")
			ex.headers = append(ex.headers, [2]string{name, strings.TrimSpace(value)})
		case w == "-d":
			i++
			ex.body = words[i]
		case w == "--data-urlencode":
			i++
			name, value, _ := strings.Cut(words[i], "=")
			ex.query.Add(name, value)
		case strings.HasPrefix(w, "localhost:7070/"):
			ex.path = strings.TrimPrefix(w, "localhost:7070")
		default:
			t.Fatalf("README: curl option %q in %q is not one this test reads", w, cmd)
		}
	}
	if ex.path == "" {
		t.Fatalf("README: no localhost:7070 URL in %q", cmd)
	}
	ex.isGetAccount = strings.HasSuffix(ex.path, "/GetAccount")
	return ex
}

// run sends the example to base and renders the answer as curl prints it.
func (ex curlExample) run(t *testing.T, base string) string {
	t.Helper()
	method, target, body := http.MethodPost, base+ex.path, io.Reader(strings.NewReader(ex.body))
	if ex.body == "" {
		body = nil
	}
	if ex.get {
		method, target, body = http.MethodGet, target+"?"+ex.query.Encode(), nil
	} else if len(ex.query) > 0 {
		body = strings.NewReader(ex.query.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range ex.headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", ex.summary, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !ex.include {
		return string(raw)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %s\n", resp.Status)
	for _, name := range []string{"Accept-Encoding", "Content-Type", "Date", "Content-Length", "Retry-After"} {
		if v := resp.Header.Get(name); v != "" {
			fmt.Fprintf(&b, "%s: %s\n", name, v)
		}
	}
	b.WriteString("\n")
	b.Write(raw)
	return b.String()
}

var (
	rfc3339     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	dateHeader  = regexp.MustCompile(`(?m)^Date: .*$`)
	jsonSpacing = regexp.MustCompile(`([,:]) `)
)

// normalizeAnswer masks what the README says will differ: times, the
// Date header, the spaces protojson adds at random, and the order of the
// headers curl prints (sorted here).
func normalizeAnswer(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\r", "")
	s = rfc3339.ReplaceAllString(s, "<time>")
	s = dateHeader.ReplaceAllString(s, "Date: <date>")
	s = jsonSpacing.ReplaceAllString(s, "$1")
	head, body, found := strings.Cut(s, "\n\n")
	if !found || !strings.HasPrefix(head, "HTTP/") {
		return s
	}
	lines := strings.Split(head, "\n")
	headers := lines[1:]
	sortStrings(headers)
	return lines[0] + "\n" + strings.Join(headers, "\n") + "\n\n" + body
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// sameAccountsButMinted reports whether two GetAccount answers differ only
// by capacity refill minted between the calls: the same accounts and
// units, reserved and spent equal, and available + reserved + spent -
// minted equal to the README's.
func sameAccountsButMinted(t *testing.T, got, want string) bool {
	t.Helper()
	type balance struct {
		Unit                                        string
		Opening, Minted, Available, Reserved, Spent json.Number
	}
	type accounts struct {
		Accounts []struct {
			Subject, Route, Region, PolicyGeneration string
			Balances                                 []balance
		}
	}
	var g, w accounts
	if json.Unmarshal([]byte(got), &g) != nil || json.Unmarshal([]byte(want), &w) != nil || len(g.Accounts) != len(w.Accounts) {
		return false
	}
	num := func(n json.Number) int64 {
		v, _ := n.Int64()
		return v
	}
	for i := range g.Accounts {
		ga, wa := g.Accounts[i], w.Accounts[i]
		if ga.Subject != wa.Subject || ga.Route != wa.Route || ga.Region != wa.Region || ga.PolicyGeneration != wa.PolicyGeneration || len(ga.Balances) != len(wa.Balances) {
			return false
		}
		for j := range ga.Balances {
			gb, wb := ga.Balances[j], wa.Balances[j]
			if gb.Unit != wb.Unit || gb.Opening != wb.Opening || gb.Reserved != wb.Reserved || gb.Spent != wb.Spent ||
				num(gb.Available)-num(gb.Minted) != num(wb.Available)-num(wb.Minted) {
				return false
			}
		}
	}
	return true
}

// TestContractInvalidCommandMessagesHaveNothingBeforeThem: docs/API.md,
// "Errors": "An INVALID_COMMAND message says what is wrong, with nothing
// before it, whichever check decided it", and "JSON conventions" quotes
// the refusal of an over-long unit name as `units: a unit name is 300
// bytes long; at most 128` (also `actualUnits`,
// `receipts[0].reservedUnits`). The checks made with the policy or the
// reservation in hand (step 4 of "Order of checks") answered with the
// command and its id before it ("settle r1: actualUnits: ...").
func TestContractInvalidCommandMessagesHaveNothingBeforeThem(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	call := func(method, body string) contractAnswer {
		return contractCall(t, srv.url, http.MethodPost, method, []byte(body), nil)
	}
	for _, setup := range [][2]string{
		{"PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat","emergencyMode":true,
		  "dimensions":[{"unit":"tokens","burst":1000},{"unit":"requests","burst":10}]}}`},
		{"Reserve", `{"reservationId":"r1","subject":"tenant-7","route":"chat","units":{"tokens":10,"requests":1}}`},
		{"Start", `{"reservationId":"r1","operationId":"op-1"}`},
		{"ShardService/IssueShard", `{"shardId":"sh-1","subject":"tenant-7","route":"chat","units":{"tokens":5},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`},
	} {
		if a := call(setup[0], setup[1]); a.status != http.StatusOK {
			t.Fatalf("%s: %d %s", setup[0], a.status, a.raw)
		}
	}
	long := strings.Repeat("u", 300)
	tooLong := "a unit name is 300 bytes long; at most 128"
	for _, c := range []struct {
		name, method, body, want string
		batch                    bool
	}{
		{"Reserve, over-long unit", "Reserve",
			`{"reservationId":"r2","subject":"tenant-7","route":"chat","units":{"tokens":1,"` + long + `":1}}`, "units: " + tooLong, false},
		{"ReserveBatch item, over-long unit", "ReserveBatch",
			`{"requests":[{"reservationId":"r2","subject":"tenant-7","route":"chat","units":{"tokens":1,"` + long + `":1}}]}`, "units: " + tooLong, true},
		{"Settle, over-long unit", "Settle",
			`{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1,"requests":1,"` + long + `":0}}`, "actualUnits: " + tooLong, false},
		{"SettleBatch item, over-long unit", "SettleBatch",
			`{"requests":[{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1,"requests":1,"` + long + `":0}}]}`, "actualUnits: " + tooLong, true},
		{"Settle, a reserved unit left out", "Settle",
			`{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1}}`,
			`actualUnits must state the usage of every unit it reserved (0 when none was used); missing "requests" (reserved 1)`, false},
		{"SettleBatch item, a reserved unit left out", "SettleBatch",
			`{"requests":[{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1}}]}`,
			`actualUnits must state the usage of every unit it reserved (0 when none was used); missing "requests" (reserved 1)`, true},
		{"RecordUsage, over-long unit", "RecordUsage",
			`{"reservationId":"rec-1","operationId":"op","subject":"tenant-7","route":"chat","actualUnits":{"tokens":1,"` + long + `":1}}`, "actualUnits: " + tooLong, false},
		{"IssueShard, over-long unit", "ShardService/IssueShard",
			`{"shardId":"sh-2","subject":"tenant-7","route":"chat","units":{"tokens":1,"` + long + `":1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`, "units: " + tooLong, false},
		{"ReconcileShard, over-long reserved unit", "ShardService/ReconcileShard",
			`{"shardId":"sh-1","gatewayId":"gw","receipts":[{"reservationId":"l-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1,"` + long + `":0},"actualUnits":{"tokens":1}}]}`,
			"receipts[0].reservedUnits: " + tooLong, false},
		{"ReconcileShard, over-long actual unit", "ShardService/ReconcileShard",
			`{"shardId":"sh-1","gatewayId":"gw","receipts":[{"reservationId":"l-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1},"actualUnits":{"tokens":1,"` + long + `":0}}]}`,
			"receipts[0].actualUnits: " + tooLong, false},
		{"ReconcileShard, a receipt without a state", "ShardService/ReconcileShard",
			`{"shardId":"sh-1","gatewayId":"gw","receipts":[{"reservationId":"l-1","state":"RESERVATION_STATE_SETTLED"},{"reservationId":"l-2"}]}`,
			"receipts[1].state is required", false},
	} {
		checkRefusal(t, call(c.method, c.body), c.name, c.batch, "INVALID_COMMAND", c.want)
	}
	if a := call("GetReservation", `{"reservationId":"r1"}`); !strings.Contains(string(a.raw), `"RESERVATION_STATE_STARTED"`) {
		t.Errorf("a refused settle changed the reservation: %s", a.raw)
	}
}

// TestContractUnknownUnitMessagesHaveNothingBeforeThem: docs/API.md,
// "Errors": an UNKNOWN_UNIT message, as an INVALID_COMMAND one, says what
// is wrong with nothing before it: the field, the unit it names and the
// units of the policy. Settle, the batches and ReconcileShard answered
// with the command and its id first ("settle r1: unknown unit ..."), and
// RecordUsage with a bare ": unknown unit ...".
func TestContractUnknownUnitMessagesHaveNothingBeforeThem(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	call := func(method, body string) contractAnswer {
		return contractCall(t, srv.url, http.MethodPost, method, []byte(body), nil)
	}
	for _, setup := range [][2]string{
		{"PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat","emergencyMode":true,
		  "dimensions":[{"unit":"tokens","burst":1000},{"unit":"requests","burst":10}]}}`},
		{"Reserve", `{"reservationId":"r1","subject":"tenant-7","route":"chat","units":{"tokens":10,"requests":1}}`},
		{"Start", `{"reservationId":"r1","operationId":"op-1"}`},
		{"Reserve", `{"reservationId":"r3","subject":"tenant-7","route":"chat","units":{"tokens":10}}`},
		{"Start", `{"reservationId":"r3","operationId":"op-3"}`},
		{"RecordUsage", `{"reservationId":"rec-2","operationId":"op","subject":"tenant-7","route":"chat","actualUnits":{"tokens":1}}`},
		{"ShardService/IssueShard", `{"shardId":"sh-1","subject":"tenant-7","route":"chat","units":{"tokens":5},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`},
	} {
		if a := call(setup[0], setup[1]); a.status != http.StatusOK {
			t.Fatalf("%s: %d %s", setup[0], a.status, a.raw)
		}
	}
	unknown := `unknown unit "gpus": policy generation 1 limits "tokens", "requests"`
	for _, c := range []struct {
		name, method, body, want string
		batch                    bool
	}{
		{"Reserve", "Reserve",
			`{"reservationId":"r2","subject":"tenant-7","route":"chat","units":{"tokens":1,"gpus":1}}`, "units: " + unknown, false},
		{"ReserveBatch item", "ReserveBatch",
			`{"requests":[{"reservationId":"r2","subject":"tenant-7","route":"chat","units":{"tokens":1,"gpus":1}}]}`, "units: " + unknown, true},
		{"Settle", "Settle",
			`{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1,"requests":1,"gpus":0}}`, "actualUnits: " + unknown, false},
		{"SettleBatch item", "SettleBatch",
			`{"requests":[{"reservationId":"r1","operationId":"op-1","actualUnits":{"tokens":1,"requests":1,"gpus":0}}]}`, "actualUnits: " + unknown, true},
		{"RecordUsage, a new id", "RecordUsage",
			`{"reservationId":"rec-1","operationId":"op","subject":"tenant-7","route":"chat","actualUnits":{"tokens":1,"gpus":1}}`, "actualUnits: " + unknown, false},
		{"RecordUsage, an id recorded before", "RecordUsage",
			`{"reservationId":"rec-2","operationId":"op","subject":"tenant-7","route":"chat","actualUnits":{"tokens":1,"gpus":1}}`, "actualUnits: " + unknown, false},
		{"IssueShard", "ShardService/IssueShard",
			`{"shardId":"sh-2","subject":"tenant-7","route":"chat","units":{"tokens":1,"gpus":1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`, "units: " + unknown, false},
		{"ReconcileShard, reserved unit", "ShardService/ReconcileShard",
			`{"shardId":"sh-1","gatewayId":"gw","receipts":[{"reservationId":"l-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1,"gpus":0},"actualUnits":{"tokens":1}}]}`,
			"receipts[0].reservedUnits: " + unknown, false},
		{"ReconcileShard, actual unit", "ShardService/ReconcileShard",
			`{"shardId":"sh-1","gatewayId":"gw","receipts":[{"reservationId":"l-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1},"actualUnits":{"tokens":1,"gpus":0}}]}`,
			"receipts[0].actualUnits: " + unknown, false},
	} {
		checkRefusal(t, call(c.method, c.body), c.name, c.batch, "UNKNOWN_UNIT", c.want)
	}
	if a := call("GetReservation", `{"reservationId":"r1"}`); !strings.Contains(string(a.raw), `"RESERVATION_STATE_STARTED"`) {
		t.Errorf("a refused settle changed the reservation: %s", a.raw)
	}
}

// checkRefusal checks that a was refused invalid_argument with reason and
// exactly the message want: a 400 for a call, or a batch's 200 whose one
// outcome carries the error.
func checkRefusal(t *testing.T, a contractAnswer, name string, batch bool, reason, want string) {
	t.Helper()
	code, got, message := a.str("code"), a.reason(), a.str("message")
	if batch {
		outcomes, _ := a.body["outcomes"].([]any)
		if a.status != http.StatusOK || len(outcomes) != 1 {
			t.Errorf("%s: %d %s; want 200 with one outcome", name, a.status, a.raw)
			return
		}
		item, _ := outcomes[0].(map[string]any)["error"].(map[string]any)
		detail, _ := item["detail"].(map[string]any)
		code, _ = item["code"].(string)
		got, _ = detail["reason"].(string)
		message, _ = item["message"].(string)
	} else if a.status != http.StatusBadRequest {
		t.Errorf("%s: HTTP %d; want 400", name, a.status)
	}
	if code != "invalid_argument" || got != reason || message != want {
		t.Errorf("%s: %s %s %q; want invalid_argument %s %q", name, code, got, message, reason, want)
	}
}

// TestContractPromises checks, over a real socket, the answers docs/API.md
// lists for malformed input, limits, content types and methods, each by
// status, code, reason and, where the page quotes it, message.
func TestContractPromises(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	post := func(method, body string) contractAnswer {
		return contractCall(t, srv.url, http.MethodPost, method, []byte(body), nil)
	}
	if a := post("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":1000,"refillUnits":10,"refillInterval":"1s"},{"unit":"requests","burst":10}]}}`); a.status != http.StatusOK {
		t.Fatalf("publish: %d %s", a.status, a.raw)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"reservationId":"` + strings.Repeat("a", 1<<20) + `"}`))
	zw.Close()
	reserve := `{"reservationId":"r-%s","subject":"tenant-7","route":"chat.generate","units":%s}`
	type want struct {
		status        int
		code, reason  string
		message       string // exact, unless match says otherwise
		match         string // "prefix" or "contains"
		noDetail      bool
		headerName    string
		headerValue   string
		emptyBodyOnly bool
	}
	for _, c := range []struct {
		name       string
		httpMethod string
		method     string
		body       []byte
		header     map[string]string
		want       want
	}{
		{"malformed JSON", "POST", "Reserve", []byte(`{not json`), nil,
			want{status: 400, code: "invalid_argument", message: "unmarshal message:", match: "prefix", noDetail: true}},
		{"empty body", "POST", "Reserve", nil, nil,
			want{status: 400, code: "invalid_argument", message: "unmarshal message: zero-length payload is not a valid JSON object", match: "prefix", noDetail: true}},
		{"misspelt field", "POST", "Settle", []byte(`{"reservationId":"r","operationId":"o","actualUnit":{"tokens":1}}`), nil,
			want{status: 400, code: "invalid_argument", message: `unknown field "actualUnit"`, match: "contains", noDetail: true}},
		{"a fraction for an integer", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "frac", `{"tokens":1.5}`)), nil,
			want{status: 400, code: "invalid_argument", noDetail: true}},
		{"negative units", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "neg", `{"tokens":-1}`)), nil,
			want{status: 400, code: "invalid_argument", reason: "INVALID_COMMAND"}},
		{"zero units", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "zero", `{"tokens":0}`)), nil,
			want{status: 400, code: "invalid_argument", reason: "INVALID_COMMAND"}},
		{"unknown unit", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "uu", `{"tokenz":1}`)), nil,
			want{status: 400, code: "invalid_argument", reason: "UNKNOWN_UNIT"}},
		{"an id of 257 bytes", "POST", "Reserve", []byte(fmt.Sprintf(reserve, strings.Repeat("x", 255), `{"tokens":1}`)), nil,
			want{status: 400, code: "invalid_argument", reason: "INVALID_COMMAND", message: "reservationId is 257 bytes long; at most 256"}},
		{"a NUL byte in an id", "POST", "Reserve", []byte(fmt.Sprintf(reserve, `a\u0000b`, `{"tokens":1}`)), nil,
			want{status: 400, code: "invalid_argument", reason: "INVALID_COMMAND", message: "reservationId contains a NUL byte"}},
		{"above maxReservation", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "big", `{"tokens":1001}`)), nil,
			want{status: 429, code: "resource_exhausted", reason: "RESERVATION_TOO_LARGE"}},
		{"no policy", "POST", "Reserve", []byte(`{"reservationId":"np","subject":"tenant-8","route":"chat.generate","units":{"tokens":1}}`), nil,
			want{status: 404, code: "not_found", reason: "NO_POLICY", message: "no active policy: tenant-8/chat.generate@global"}},
		{"an unknown reservation", "POST", "Start", []byte(`{"reservationId":"nobody","operationId":"o"}`), nil,
			want{status: 404, code: "not_found", reason: "RESERVATION_NOT_FOUND", message: "reservation not found: nobody"}},
		{"an empty batch", "POST", "ReserveBatch", []byte(`{"requests":[]}`), nil,
			want{status: 400, code: "invalid_argument", reason: "INVALID_COMMAND", message: "requests: a batch needs at least one item", match: "prefix"}},
		{"text/plain", "POST", "Reserve", []byte(`{}`), map[string]string{"Content-Type": "text/plain"},
			want{status: 415, headerName: "Accept-Post", headerValue: "application/json", emptyBodyOnly: true}},
		{"no Content-Type", "POST", "Reserve", []byte(`{}`), map[string]string{"Content-Type": ""},
			want{status: 415, emptyBodyOnly: true}},
		{"GET on a write method", "GET", "Reserve?encoding=json&message=%7B%7D", nil, map[string]string{"Content-Type": ""},
			want{status: 405, headerName: "Allow", headerValue: "POST", emptyBodyOnly: true}},
		{"an unknown method", "POST", "Reserv", []byte(`{}`), nil,
			want{status: 404, code: "unimplemented", message: "no method or endpoint at /capledger.v1.LedgerService/Reserv", match: "prefix"}},
		{"brotli", "POST", "Reserve", []byte(`{}`), map[string]string{"Content-Encoding": "br"},
			want{status: 501, code: "unimplemented", message: `unknown compression "br": supported encodings are gzip`, noDetail: true}},
		{"a body over the limit", "POST", "Reserve", []byte(`{"reservationId":"` + strings.Repeat("a", 1<<20) + `"}`), nil,
			want{status: 413, code: "resource_exhausted", message: "is larger than the limit of 1048576 bytes", match: "contains", noDetail: true}},
		{"a gzip body over the limit once decompressed", "POST", "Reserve", gz.Bytes(), map[string]string{"Content-Encoding": "gzip"},
			want{status: 413, code: "resource_exhausted", noDetail: true}},
		{"Connect-Timeout-Ms not a number", "POST", "Reserve", []byte(`{}`), map[string]string{"Connect-Timeout-Ms": "abc"},
			want{status: 400, code: "invalid_argument", message: "parse timeout:", match: "prefix", noDetail: true}},
		{"Connect-Protocol-Version 2", "POST", "Reserve", []byte(`{}`), map[string]string{"Connect-Protocol-Version": "2"},
			want{status: 400, code: "invalid_argument", message: `Connect-Protocol-Version must be "1": got "2"`, noDetail: true}},
		{"Connect-Timeout-Ms 0", "POST", "Reserve", []byte(fmt.Sprintf(reserve, "t0", `{"tokens":1}`)), map[string]string{"Connect-Timeout-Ms": "0"},
			want{status: 504, code: "deadline_exceeded", message: "context deadline exceeded", noDetail: true}},
		{"POST on /healthz", "POST", "/healthz", nil, nil,
			want{status: 405, headerName: "Allow", headerValue: "GET, HEAD"}},
	} {
		a := contractCall(t, srv.url, c.httpMethod, c.method, c.body, c.header)
		w := c.want
		if a.status != w.status {
			t.Errorf("%s: HTTP %d %.300s; want %d", c.name, a.status, a.raw, w.status)
			continue
		}
		if w.emptyBodyOnly && len(a.raw) != 0 {
			t.Errorf("%s: body %q; want none", c.name, a.raw)
		}
		if w.headerName != "" && !strings.Contains(a.header.Get(w.headerName), w.headerValue) {
			t.Errorf("%s: %s %q; want it to hold %q", c.name, w.headerName, a.header.Get(w.headerName), w.headerValue)
		}
		if w.code != "" && a.str("code") != w.code {
			t.Errorf("%s: code %q; want %q (%s)", c.name, a.str("code"), w.code, a.raw)
		}
		if w.reason != "" && a.reason() != w.reason {
			t.Errorf("%s: reason %q; want %q (%s)", c.name, a.reason(), w.reason, a.raw)
		}
		if _, has := a.body["details"]; w.noDetail && has {
			t.Errorf("%s: a detail; want none (%s)", c.name, a.raw)
		}
		msg := a.str("message")
		matched := msg == w.message
		switch w.match {
		case "prefix":
			matched = strings.HasPrefix(msg, w.message)
		case "contains":
			matched = strings.Contains(msg, w.message)
		}
		if w.message != "" && !matched {
			t.Errorf("%s: message %q; want %s %q", c.name, msg, map[string]string{"": "exactly", "prefix": "one starting with", "contains": "one holding"}[w.match], w.message)
		}
	}
	// Connect-Timeout-Ms: 0 applied nothing.
	if a := post("GetReservation", `{"reservationId":"r-t0"}`); a.status != http.StatusNotFound {
		t.Errorf("a Reserve with Connect-Timeout-Ms 0 was applied: %d %s", a.status, a.raw)
	}
	// A ListUsageUnknown page token belongs to its filters: with another,
	// 400 INVALID_COMMAND, the message beginning as API.md quotes it.
	for _, id := range []string{"u1", "u2"} {
		for _, step := range [][2]string{
			{"Reserve", fmt.Sprintf(reserve, id, `{"tokens":1}`)},
			{"Start", `{"reservationId":"r-` + id + `","operationId":"op"}`},
			{"MarkUsageUnknown", `{"reservationId":"r-` + id + `"}`},
		} {
			if a := post(step[0], step[1]); a.status != http.StatusOK {
				t.Fatalf("%s %s: %d %s", step[0], id, a.status, a.raw)
			}
		}
	}
	first := post("ListUsageUnknown", `{"subject":"tenant-7","pageSize":1}`)
	token := first.str("nextPageToken")
	if first.status != http.StatusOK || token == "" {
		t.Fatalf("ListUsageUnknown page 1 of 2: %d %s; want a nextPageToken", first.status, first.raw)
	}
	a := post("ListUsageUnknown", `{"subject":"tenant-8","pageSize":1,"pageToken":"`+token+`"}`)
	if a.status != http.StatusBadRequest || a.reason() != "INVALID_COMMAND" || !strings.HasPrefix(a.str("message"), "pageToken: issued for another subject or route filter") {
		t.Errorf("a page token with another subject filter: %d %s; want 400 INVALID_COMMAND, pageToken: issued for another subject or route filter ...", a.status, a.raw)
	}
}

// TestContractExactlyOnce: the same request id sent concurrently is
// applied once and replayed to every other caller (docs/API.md, Reserve
// and Settle; CLIENTS.md section 4), and a refund is given once.
func TestContractExactlyOnce(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	post := func(method, body string) contractAnswer {
		return contractCall(t, srv.url, http.MethodPost, method, []byte(body), nil)
	}
	if a := post("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat","dimensions":[{"unit":"tokens","burst":1000}]}}`); a.status != http.StatusOK {
		t.Fatalf("publish: %d %s", a.status, a.raw)
	}
	const callers = 12
	concurrently := func(method, body string) []contractAnswer {
		answers := make([]contractAnswer, callers)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = post(method, body)
			}()
		}
		wg.Wait()
		return answers
	}
	applied := 0
	for _, a := range concurrently("Reserve", `{"reservationId":"r1","subject":"tenant-7","route":"chat","units":{"tokens":100}}`) {
		if a.status != http.StatusOK {
			t.Fatalf("reserve: %d %s", a.status, a.raw)
		}
		if a.body["replayed"] != true {
			applied++
		}
	}
	if applied != 1 {
		t.Errorf("%d concurrent reserves of one id applied %d times; want once", callers, applied)
	}
	if a := post("Start", `{"reservationId":"r1","operationId":"op"}`); a.status != http.StatusOK {
		t.Fatalf("start: %d %s", a.status, a.raw)
	}
	refunds := 0
	for _, a := range concurrently("Settle", `{"reservationId":"r1","operationId":"op","actualUnits":{"tokens":40}}`) {
		if a.status != http.StatusOK {
			t.Fatalf("settle: %d %s", a.status, a.raw)
		}
		if _, ok := a.body["refundedUnits"]; ok {
			refunds++
		}
	}
	if refunds != 1 {
		t.Errorf("%d concurrent settles of one id refunded %d times; want once", callers, refunds)
	}
	a := post("GetAccount", `{"subject":"tenant-7","route":"chat"}`)
	if !strings.Contains(string(a.raw), `"available":"960"`) || !strings.Contains(string(a.raw), `"spent":"40"`) {
		t.Errorf("account after one reserve of 100 settled at 40: %s; want available 960, spent 40", a.raw)
	}
	if a := post("Reserve", `{"reservationId":"r1","subject":"tenant-7","route":"chat","units":{"tokens":101}}`); a.status != http.StatusConflict || a.reason() != "DIGEST_MISMATCH" {
		t.Errorf("the id again with another digest: %d %s; want 409 DIGEST_MISMATCH", a.status, a.raw)
	}
}
