package sim

type FairnessResult struct{}
type fairness struct{}

func (f *fairness) init(w *world)          {}
func (f *fairness) result() FairnessResult { return FairnessResult{} }
func (f *fairness) check(w *world)         {}
