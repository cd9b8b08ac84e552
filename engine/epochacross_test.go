package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// epochCallStore counts the epoch worker's store calls: AccountsByEpoch
// per generation and across generations, and EpochIndexCatchUp.
type epochCallStore struct {
	store.Store
	perGeneration, across, catchUps atomic.Int64
	policies                        atomic.Int64
	// listedAcross counts the accounts the reads across generations
	// returned.
	listedAcross atomic.Int64
}

func (s *epochCallStore) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	out, err := s.Store.PolicyList(ctx)
	s.policies.Add(int64(len(out)))
	return out, err
}

func (s *epochCallStore) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	out, err := s.Store.PolicyPage(ctx, f)
	s.policies.Add(int64(len(out)))
	return out, err
}

func (s *epochCallStore) PolicyListAfter(ctx context.Context, after uint64) ([]ledger.Policy, error) {
	out, err := s.Store.PolicyListAfter(ctx, after)
	s.policies.Add(int64(len(out)))
	return out, err
}

func (s *epochCallStore) AccountsByEpoch(ctx context.Context, f store.EpochFilter) ([]ledger.Account, store.EpochCursor, error) {
	page, next, err := s.Store.AccountsByEpoch(ctx, f)
	if f.AllGenerations {
		s.across.Add(1)
		s.listedAcross.Add(int64(len(page)))
	} else {
		s.perGeneration.Add(1)
	}
	return page, next, err
}

func (s *epochCallStore) EpochIndexCatchUp(ctx context.Context, f store.EpochFilter) (store.EpochCursor, bool, error) {
	s.catchUps.Add(1)
	return s.Store.EpochIndexCatchUp(ctx, f)
}

// reads returns the calls counted since the last reads and starts again.
func (s *epochCallStore) reads() (perGeneration, across, catchUps int64) {
	return s.perGeneration.Swap(0), s.across.Swap(0), s.catchUps.Swap(0)
}

// epochLengthsOfTest are the epoch lengths the tests below give their
// generations in turn.
var epochLengthsOfTest = []time.Duration{10 * time.Minute, time.Hour, 24 * time.Hour}

// publishTenants publishes at now a policy of its own for each of the
// subjects tenant-<from> to tenant-<to-1> on chat.generate/eu, their
// epoch lengths epochLengthsOfTest in turn.
func publishTenants(t *testing.T, core *Core, now time.Time, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "eu"},
			Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1 << 40, RefillUnits: 1, RefillInterval: time.Second}},
			EpochLength: epochLengthsOfTest[i%len(epochLengthsOfTest)]}.WithDefaults()
		commitAlone(t, core, now, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
}

// reserveFor reserves a token for tenant-<i> at now under id.
func reserveFor(t *testing.T, core *Core, now time.Time, i int, id string) {
	t.Helper()
	cmd := reserveCmd(id, 1)
	cmd.Subject = fmt.Sprintf("tenant-%04d", i)
	commitAlone(t, core, now, cmd)
}

// epochPass runs one full epoch pass at now as the engine's worker does:
// its pages committed at now, then the index's catch-up, then remembered.
func epochPass(t *testing.T, core *Core, now time.Time, scans *EpochScans) []ledger.Command {
	t.Helper()
	p, err := core.EpochPager(context.Background(), now, 8, scans)
	if err != nil {
		t.Fatal(err)
	}
	cmds, _ := pages(t, core, p, now)
	if err := p.CatchUp(context.Background(), func() bool { return true }, func(time.Duration) {}); err != nil {
		t.Fatal(err)
	}
	scans.Update(p, true)
	return cmds
}

// An epoch pass with nothing due costs a few store reads however many
// generations there are: one read of the index across generations and
// one catch-up per epoch length, not one of each per generation (with a
// policy per tenant, 100,000 generations cost an idle server 14-26 s of
// CPU a minute), and no policy but those published since the last pass.
// A new leader's first pass reads all of them by one range from the
// start of that index.
func TestEpochPassReadsDoNotGrowWithGenerations(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			var idle [2][3]int64
			for run, generations := range []int{30, 300} {
				st := &epochCallStore{Store: open(t)}
				core := NewCore(st)
				publishTenants(t, core, t0, 0, generations)
				for i := range 12 {
					reserveFor(t, core, t0.Add(time.Minute), i, fmt.Sprintf("rl-%d", i))
				}
				var scans EpochScans
				st.reads()
				epochPass(t, core, t0.Add(2*time.Minute), &scans)
				st.policies.Store(0)
				if perGeneration, across, catchUps := st.reads(); perGeneration != 0 || across != 1 || catchUps != 1 {
					t.Errorf("%d generations, a new leader's first pass: %d reads per generation, %d across, %d catch-ups; want 0, 1, 1",
						generations, perGeneration, across, catchUps)
				}
				// Nothing is due; then the 10-minute epoch ends, and the
				// busy accounts of its generations close.
				for _, at := range []time.Duration{3 * time.Minute, 4 * time.Minute} {
					if cmds := epochPass(t, core, t0.Add(at), &scans); len(cmds) != 0 {
						t.Fatalf("nothing due: %d closes", len(cmds))
					}
					perGeneration, across, catchUps := st.reads()
					idle[run] = [3]int64{perGeneration, across, catchUps}
					if n := st.policies.Swap(0); n != 0 {
						t.Errorf("%d generations, a pass with nothing due read %d policies; want none (none published since)", generations, n)
					}
					if perGeneration != 0 || across != int64(len(epochLengthsOfTest)) || catchUps != int64(len(epochLengthsOfTest)) {
						t.Errorf("%d generations, a pass with nothing due: %d reads per generation, %d across, %d catch-ups; want 0 and one of each per epoch length (%d)",
							generations, perGeneration, across, catchUps, len(epochLengthsOfTest))
					}
				}
				// Three generations published since: read by the same
				// ranges, none by its own index.
				publishTenants(t, core, t0.Add(5*time.Minute), generations, generations+3)
				for i := generations; i < generations+3; i++ {
					reserveFor(t, core, t0.Add(5*time.Minute), i, fmt.Sprintf("rl-%d", i))
				}
				epochPass(t, core, t0.Add(6*time.Minute), &scans)
				if perGeneration, across, _ := st.reads(); perGeneration != 0 || across != int64(len(epochLengthsOfTest)) {
					t.Errorf("%d generations, 3 published since the last pass: %d reads per generation, %d across; want 0 and %d",
						generations, perGeneration, across, len(epochLengthsOfTest))
				}
				if cmds := epochPass(t, core, t0.Add(11*time.Minute), &scans); len(cmds) != 5 {
					t.Errorf("%d generations, the 10-minute epoch ended: %d closes, want the 5 busy accounts of that length", generations, len(cmds))
				}
				if perGeneration, across, _ := st.reads(); perGeneration != 0 || across > int64(len(epochLengthsOfTest))+1 {
					t.Errorf("%d generations, a pass that closes 5 accounts in pages of 8: %d reads per generation, %d across", generations, perGeneration, across)
				}
			}
			if idle[0] != idle[1] {
				t.Errorf("an idle pass's reads grew with the generations: %v with 30, %v with 300", idle[0], idle[1])
			}
		})
	}
}

// Every account whose epoch ended and is not idle gets its close, over
// many generations of different epoch lengths: after each full pass, at
// random times over two days of random traffic, no account is left with
// a busy epoch that ended. Generations are published after the leader's
// first pass (a few, read each by its own index; then many at once, read
// by one range from the start of the index across generations), and a
// new leader takes over (it remembers nothing). On SQLite the closes
// leave index entries behind (schema version 14), which only the
// catch-up across generations moves.
func TestEpochPassesCloseEveryDueAccountAcrossGenerations(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			core := NewCore(st)
			rng := rand.New(rand.NewPCG(1, 2))
			tenants := 24
			publishTenants(t, core, t0, 0, tenants)
			var scans EpochScans
			now := t0
			reserved := 0
			closes := 0
			for step := 0; now.Before(t0.Add(48 * time.Hour)); step++ {
				now = now.Add(time.Duration(1+rng.IntN(13)) * time.Minute)
				switch step {
				case 20: // a few generations after the first passes
					publishTenants(t, core, now, tenants, tenants+3)
					tenants += 3
				case 60: // many at once
					publishTenants(t, core, now, tenants, tenants+40)
					tenants += 40
				case 150: // a new leader, after 10 steps without one
					scans = EpochScans{}
				}
				for range rng.IntN(6) {
					// Stamped up to 110 s back: a command may commit after
					// a pass that started later (EpochLateness).
					reserved++
					reserveFor(t, core, now.Add(-time.Duration(rng.IntN(110))*time.Second), rng.IntN(tenants), fmt.Sprintf("rl-%d", reserved))
				}
				if step >= 140 && step < 150 {
					continue // no leader: nothing closes
				}
				closes += len(epochPass(t, core, now, &scans))
				checkNoBusyEpochEnded(t, st, now, step)
			}
			if closes < 100 {
				t.Fatalf("only %d closes over two days: the test does not exercise the worker", closes)
			}
		})
	}
}

// checkNoBusyEpochEnded fails t for every account of st whose epoch
// ended by now and is not idle, read through the index per generation
// (not the one across generations the passes read).
func checkNoBusyEpochEnded(t *testing.T, st store.Store, now time.Time, step int) {
	t.Helper()
	ctx := context.Background()
	policies, err := st.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies {
		f := store.EpochFilter{Generation: p.Generation, StartedBy: now.Add(-p.EpochLength), Limit: 100}
		for {
			page, next, err := st.AccountsByEpoch(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range page {
				if !a.EpochIdle() && !a.EpochStart.After(now.Add(-p.EpochLength)) {
					t.Fatalf("step %d at %s: %s's epoch of %s from %s ended and is not closed", step, now, a.Key, p.EpochLength, a.EpochStart)
				}
			}
			if len(page) < f.Limit {
				break
			}
			f.After = next
		}
	}
}

// A command stamped before the last pass's start that commits after it
// (EpochLateness) on an idle account rolls it into an epoch that pass may
// not have read: the next pass reads the epoch starts that recent again,
// across generations too, and closes it.
func TestEpochPassAcrossGenerationsReadsLateCommands(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			core := NewCore(st)
			publishTenants(t, core, t0.Add(-2*time.Hour), 0, 30)
			reserveFor(t, core, t0.Add(-time.Hour), 0, "rl-early") // tenant-0000: epochs of 10 minutes
			var scans EpochScans
			epochPass(t, core, t0.Add(-time.Hour+11*time.Minute), &scans) // closes it; idle since
			epochPass(t, core, t0.Add(10*time.Minute+10*time.Second), &scans)
			// Stamped 14:09:30, committed after the pass of 14:10:10: the
			// idle account rolls to the epoch of 14:00, which ended.
			reserveFor(t, core, t0.Add(9*time.Minute+30*time.Second), 0, "rl-late")
			cmds := epochPass(t, core, t0.Add(11*time.Minute), &scans)
			if len(cmds) != 1 || cmds[0].Account.Subject != "tenant-0000" {
				t.Fatalf("the pass after a late command closes %v; want tenant-0000's epoch of 14:00", cmds)
			}
			checkNoBusyEpochEnded(t, st, t0.Add(11*time.Minute), 0)
		})
	}
}

// A pass after a burst of publishes (more than freshPerGeneration
// generations since the last pass: tenants onboarded together) reads the
// same ranges as any other pass, not the index across generations from
// its start: accounts idle since long ago, their epochs ended, are not
// read again. The burst's own accounts still close when their epochs end.
func TestEpochPassAfterABurstOfPublishesReadsNoIdleAccount(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			st := &epochCallStore{Store: open(t)}
			core := NewCore(st)
			const tenants = 30
			publishTenants(t, core, t0, 0, tenants)
			for i := range tenants {
				reserveFor(t, core, t0.Add(time.Minute), i, fmt.Sprintf("rl-%d", i))
			}
			var scans EpochScans
			// Every account's epoch closes; each is idle from then on.
			if cmds := epochPass(t, core, t0.Add(25*time.Hour), &scans); len(cmds) != tenants {
				t.Fatalf("%d closes, want %d", len(cmds), tenants)
			}
			epochPass(t, core, t0.Add(25*time.Hour+time.Minute), &scans)
			st.reads()
			st.listedAcross.Store(0)
			burst := freshPerGeneration + 4
			publishTenants(t, core, t0.Add(25*time.Hour+2*time.Minute), tenants, tenants+burst)
			for i := tenants; i < tenants+burst; i++ {
				reserveFor(t, core, t0.Add(25*time.Hour+2*time.Minute), i, fmt.Sprintf("rl-%d", i))
			}
			if cmds := epochPass(t, core, t0.Add(25*time.Hour+3*time.Minute), &scans); len(cmds) != 0 {
				t.Fatalf("nothing due after the burst: %d closes", len(cmds))
			}
			perGeneration, across, _ := st.reads()
			if listed := st.listedAcross.Load(); listed != 0 || perGeneration != 0 || across != int64(len(epochLengthsOfTest)) {
				t.Errorf("the pass after %d generations published since the last: %d accounts listed across generations (want 0: none is due), %d reads per generation (want 0), %d across (want %d)",
					burst, listed, perGeneration, across, len(epochLengthsOfTest))
			}
			// The burst's 10-minute accounts (every third) close when their
			// epoch ends.
			want := 0
			for i := tenants; i < tenants+burst; i++ {
				if epochLengthsOfTest[i%len(epochLengthsOfTest)] == 10*time.Minute {
					want++
				}
			}
			if cmds := epochPass(t, core, t0.Add(25*time.Hour+11*time.Minute), &scans); len(cmds) != want {
				t.Errorf("the burst's 10-minute epoch ended: %d closes, want %d", len(cmds), want)
			}
		})
	}
}

// A clock stepped back by more than EpochLateness (NTP correcting a
// replica by an hour) stamps commands long before the last pass's clock:
// an idle account they touch, and the account they open under a
// generation published since, starts an epoch before the range that pass
// left to read. The first pass at a clock earlier than the last one
// remembered reads every generation from its start, as a new leader
// does, and closes both epochs when they end.
func TestEpochPassAfterTheClockStepsBackClosesWhatCommandsStampedBeforeIt(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			core := NewCore(st)
			publishTenants(t, core, t0, 0, 3) // tenant-0000: epochs of 10 minutes
			reserveFor(t, core, t0.Add(time.Minute), 0, "rl-0")
			var scans EpochScans
			epochPass(t, core, t0.Add(11*time.Minute), &scans) // closes it; idle since
			last := t0.Add(2*time.Hour + 4*time.Minute)
			epochPass(t, core, last, &scans)
			// The clock steps back an hour: the idle account rolls into the
			// epoch of 15:00, and tenant-0003's new generation (10-minute
			// epochs) opens an account in it.
			back := last.Add(-time.Hour)
			reserveFor(t, core, back, 0, "rl-1")
			publishTenants(t, core, back, 3, 4)
			reserveFor(t, core, back, 3, "rl-2")
			now := back.Add(11 * time.Minute)
			cmds := epochPass(t, core, now, &scans)
			if len(cmds) != 2 {
				t.Errorf("the first pass after the clock stepped back an hour closes %v; want the epochs of 15:00 of tenant-0000 and tenant-0003", cmds)
			}
			checkNoBusyEpochEnded(t, st, now, 0)
			now = now.Add(time.Minute)
			epochPass(t, core, now, &scans)
			checkNoBusyEpochEnded(t, st, now, 1)
		})
	}
}
