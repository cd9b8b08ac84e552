package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/console"
)

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func TestHandlerServesTheEmbeddedFiles(t *testing.T) {
	h := console.Handler()
	for path, wantType := range map[string]string{
		"/ui/":                               "text/html",
		"/ui/app.js":                         "text/javascript",
		"/ui/style.css":                      "text/css",
		"/ui/vendor/uplot/uPlot.iife.min.js": "text/javascript",
		"/ui/vendor/uplot/uPlot.min.css":     "text/css",
		"/ui/vendor/uplot/LICENSE":           "text/plain",
	} {
		resp := get(t, h, http.MethodGet, path)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), wantType) {
			t.Errorf("GET %s: %d %s, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), wantType)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
	for from, to := range map[string]string{"/ui": "/ui/", "/ui?x=1": "/ui/?x=1", "/ui?a=1&b=%20two": "/ui/?a=1&b=%20two"} {
		if resp := get(t, h, http.MethodGet, from); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != to {
			t.Errorf("GET %s: %d to %q, want a redirect to %s (the query kept)", from, resp.StatusCode, resp.Header.Get("Location"), to)
		}
	}
	if resp := get(t, h, http.MethodPost, "/ui/"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d, want 405", resp.StatusCode)
	}
	if resp := get(t, h, http.MethodGet, "/ui/missing.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ui/missing.js: %d, want 404", resp.StatusCode)
	}
}

// The vendored uPlot is the version UPlotVersion names, the page and the
// docs say, and its license is beside it.
func TestVendoredUPlotVersion(t *testing.T) {
	lib, err := os.ReadFile("assets/vendor/uplot/uPlot.iife.min.js")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`uPlot \(v([0-9.]+)\)`).FindSubmatch(lib)
	if m == nil || string(m[1]) != console.UPlotVersion {
		t.Fatalf("vendored uPlot header %q, UPlotVersion %s", m, console.UPlotVersion)
	}
	page := get(t, console.Handler(), http.MethodGet, "/ui/")
	body, _ := io.ReadAll(page.Body)
	if !strings.Contains(string(body), "uPlot "+console.UPlotVersion) {
		t.Errorf("index.html does not name uPlot %s", console.UPlotVersion)
	}
	license, err := os.ReadFile("assets/vendor/uplot/LICENSE")
	if err != nil || !strings.Contains(string(license), "MIT License") {
		t.Errorf("uPlot's license: %v", err)
	}
}

// docs/CONSOLE.md states how often the shown page reloads its data and how
// much of the page's own sampling the overview's rate charts keep: the
// figures app.js uses (REFRESH_MS, HISTORY_SECONDS).
func TestDocStatesRefreshAndChartWindow(t *testing.T) {
	js, err := os.ReadFile("assets/app.js")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/CONSOLE.md")
	if err != nil {
		t.Fatal(err)
	}
	constant := func(name string) int {
		m := regexp.MustCompile(`const ` + name + ` = ([0-9]+);`).FindSubmatch(js)
		if m == nil {
			t.Fatalf("app.js has no const %s", name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	refresh := time.Duration(constant("REFRESH_MS")) * time.Millisecond
	window := time.Duration(constant("HISTORY_SECONDS")) * time.Second
	text := strings.Join(strings.Fields(string(doc)), " ")
	if want := fmt.Sprintf("reloads its data every %d s", int(refresh.Seconds())); !strings.Contains(text, want) {
		t.Errorf("CONSOLE.md does not say %q", want)
	}
	if want := fmt.Sprintf("the last %d minutes", int(window.Minutes())); !strings.Contains(text, want) {
		t.Errorf("the rate charts keep %s of samples; CONSOLE.md does not say %q", window, want)
	}
}
