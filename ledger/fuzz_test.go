package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// FuzzCommands decodes arbitrary bytes into a sequence of commands (time
// advances, publishes with arbitrary terms, rollbacks, reserves, starts,
// settles, releases, expiry, unknown usage, refill, drain, epoch close) and
// applies them through the harness, which runs the conservation audit and
// the step check after each one. Any input is a valid sequence; malformed
// commands must be answered with an error and change nothing.
//
// Run it with
//
//	go test ./ledger/ -run '^$' -fuzz FuzzCommands -fuzztime 5m
//
// The seed corpus is in testdata/fuzz/FuzzCommands.
func FuzzCommands(f *testing.F) {
	f.Add([]byte{opPublish, 0, 10, 5, 1, 0, 0, opReserve, 0, 0, 3, 0, opStart, 0, 0, opSettle, 0, 0, 2, 0})
	f.Add([]byte{opPublish, 0, 100, 10, 1, 2, 0, opReserve, 1, 0, 60, 0, opReserve, 2, 0, 60, 0, opStart, 1, 0,
		opSettle, 1, 0, 200, 0, opAdvance, 3, opReserve, 3, 0, 1, 0, opRefill, 0, 1})
	f.Add([]byte{opPublish, 0, 50, 5, 1, 0, 0, opReserve, 0, 0, 20, 0, opStart, 0, 0, opPublish, 0, 60, 5, 2, 1, 0,
		opReserve, 1, 0, 5, 0, opSettle, 0, 0, 1, 0, opRollback, 0, 2, opDrain, 0, 2, opAdvance, 200})
	f.Add([]byte{opPublish, 0, 10, 1, 1, 0, 0, opReserve, 0, 0, 5, 0, opAdvance, 40, opClaim, 0, opStart, 0, 0,
		opExpire, 0, opExpire, 0, opRelease, 0})
	f.Add([]byte{opPublish, 0, 10, 1, 1, 0, 0, opRecord, 0, 0, 0, 0, 30, 0, opRecord, 1, 0, 0, 0, 4, 0,
		opRecord, 0, 0, 0, 0, 30, 0, opReserve, 2, 0, 1, 0, opAdvance, 50, opRecord, 2, 2, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newChecked(t)
		in := fuzzInput{data: data}
		for steps := 0; !in.done() && steps < 400; steps++ {
			cmd, advance := in.command()
			if advance > 0 {
				c.advance(advance)
				continue
			}
			c.apply(cmd)
		}
	})
}

// Opcodes of the fuzz encoding: one byte, then the operands named at
// fuzzInput.command.
const (
	opAdvance = iota
	opPublish
	opRollback
	opReserve
	opStart
	opSettle
	opRelease
	opClaim
	opExpire
	opMarkUnknown
	opRefill
	opDrain
	opCloseEpoch
	opReserveAny // a reserve with raw operands: any subject, units and generation
	opRecord     // usage nothing reserved: id, digest, subject, operation, units x2
	opCount
)

var fuzzSubjects = []string{"t0", "t1", "t2", ""}

// fuzzInput reads operands from the input; past its end every read is 0,
// so any byte string decodes.
type fuzzInput struct {
	data []byte
	pos  int
}

func (in *fuzzInput) done() bool { return in.pos >= len(in.data) }

func (in *fuzzInput) byte() byte {
	if in.done() {
		return 0
	}
	b := in.data[in.pos]
	in.pos++
	return b
}

// units decodes one amount: small values mostly; 250..255 are the edges
// (0, max, beyond max, negative, large).
func (in *fuzzInput) units() ledger.Units {
	switch b := in.byte(); b {
	case 250:
		return ledger.MaxUnits
	case 251:
		return ledger.MaxUnits + 1
	case 252:
		return -1
	case 253:
		return 1 << 40
	case 254:
		return -(1 << 62)
	case 255:
		return 1 << 62
	default:
		return ledger.Units(b)
	}
}

func (in *fuzzInput) subject() string { return fuzzSubjects[int(in.byte())%len(fuzzSubjects)] }
func (in *fuzzInput) id() string      { return "r" + string(rune('a'+in.byte()%16)) }

func (in *fuzzInput) account() ledger.AccountKey {
	subject := in.subject()
	return ledger.AccountKey{Subject: subject, Route: "chat", Region: "eu", Generation: uint64(in.byte() % 8)}
}

// command decodes the next command, or a time advance.
func (in *fuzzInput) command() (ledger.Command, time.Duration) {
	switch in.byte() % opCount {
	case opAdvance: // seconds; 200+ are hours
		b := in.byte()
		if b >= 200 {
			return ledger.Command{}, time.Duration(b-199) * time.Hour
		}
		return ledger.Command{}, time.Duration(b)*time.Second + time.Millisecond
	case opPublish: // subject, burst, refill, interval, max overdraft, flags
		subject := in.subject()
		if subject == "t2" {
			subject = ledger.AnySubject
		}
		burst, refill := in.units(), in.units()
		interval := time.Duration(in.byte()) * time.Second / 4
		overdraft := in.units()
		flags := in.byte()
		dims := []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: refill, RefillInterval: interval, MaxOverdraft: overdraft}}
		if flags&1 != 0 {
			dims = append(dims, ledger.Dimension{Unit: "requests", Burst: 3, RefillUnits: 1, RefillInterval: time.Second})
		}
		if flags&2 != 0 {
			dims[0], dims = ledger.Dimension{Unit: "requests", Burst: 5, RefillUnits: 1, RefillInterval: time.Second}, append(dims, dims[0])
		}
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}, Dimensions: dims,
			HoldTTL: time.Duration(flags>>4+1) * 5 * time.Second}
		if flags&4 != 0 {
			p.Rollout = ledger.RolloutShadow
		}
		if flags&8 != 0 {
			p.ExecutionLimit = 10 * time.Second
		}
		p = p.WithDefaults()
		return ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}, 0
	case opRollback:
		subject := in.subject()
		if subject == "t2" {
			subject = ledger.AnySubject
		}
		return ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"},
			Generation: uint64(in.byte() % 8)}, 0
	case opReserve: // id, subject, units, units
		id, subject := in.id(), in.subject()
		return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "d-" + id, Subject: subject,
			Route: "chat", Region: "eu", Units: ledger.Amounts{in.units(), in.units()}}, 0
	case opReserveAny: // id, digest, subject, route, units x4, generation
		id := in.id()
		digest := "d-" + id
		if in.byte()%2 == 1 {
			digest = "other"
		}
		cmd := ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: digest, Subject: in.subject(),
			Route: "chat", Region: "eu"}
		if in.byte()%4 == 0 {
			cmd.Route = ""
		}
		for i := range cmd.Units {
			cmd.Units[i] = in.units()
		}
		cmd.Generation = uint64(in.byte() % 8)
		return cmd, 0
	case opRecord: // id, digest, subject, operation, units, units
		id := in.id()
		digest := "rec-" + id
		switch in.byte() % 4 {
		case 2:
			digest = "d-" + id // a reserve's digest
		case 3:
			digest = "other"
		}
		subject := in.subject()
		return ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: digest, Subject: subject,
			Route: "chat", Region: "eu", OperationID: in.operation(id), Units: ledger.Amounts{in.units(), in.units()}}, 0
	case opStart: // id, operation
		id := in.id()
		return ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: in.operation(id)}, 0
	case opSettle: // id, operation, units, units
		id := in.id()
		return ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: in.operation(id),
			Units: ledger.Amounts{in.units(), in.units()}}, 0
	case opRelease:
		return ledger.Command{Kind: ledger.KindRelease, ReservationID: in.id()}, 0
	case opClaim:
		return ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: in.id()}, 0
	case opExpire:
		return ledger.Command{Kind: ledger.KindExpire, ReservationID: in.id()}, 0
	case opMarkUnknown:
		return ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: in.id()}, 0
	case opRefill:
		return ledger.Command{Kind: ledger.KindRefill, Account: in.account()}, 0
	case opDrain:
		return ledger.Command{Kind: ledger.KindDrain, Account: in.account()}, 0
	default: // opCloseEpoch
		return ledger.Command{Kind: ledger.KindCloseEpoch, Account: in.account()}, 0
	}
}

// operation is the reservation's own operation id, another one, or none.
func (in *fuzzInput) operation(id string) string {
	switch in.byte() % 8 {
	case 6:
		return "op-other"
	case 7:
		return ""
	}
	return "op-" + id
}
