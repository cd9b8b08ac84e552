package engine

import "github.com/capledger/capledger/ledger"

// deciding returns the generation deciding for each subject key w shows
// (absent: none decided), as one map for the tests to compare.
func (w ShownWith) deciding() map[ledger.PolicyKey]uint64 {
	if w.one != nil {
		return w.one.Deciding
	}
	m := map[ledger.PolicyKey]uint64{}
	for subject, v := range w.of {
		if g, ok := v.Deciding[subject]; ok {
			m[subject] = g
		}
	}
	return m
}
