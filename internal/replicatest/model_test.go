package replicatest

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// The model itself must be able to fail: an oversold history (two 600s
// admitted from 1,000 with both holding) is illegal, the seed's story is
// legal, and a lost answer admits both outcomes.
func TestAccountModel(t *testing.T) {
	op := func(client int, call, ret int64, in AccountInput, out AccountOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	ok, rejected, unknown := AccountOutput{OK: true}, AccountOutput{Rejected: true}, AccountOutput{Unknown: true}
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"seed: one of three 600s admitted, settle 200, then 600 fits", []porcupine.Operation{
			op(0, 0, 10, AccountInput{ID: "a", Units: 600}, ok),
			op(1, 1, 11, AccountInput{ID: "b", Units: 600}, rejected),
			op(2, 2, 12, AccountInput{ID: "c", Units: 600}, rejected),
			op(0, 20, 30, AccountInput{Settle: true, ID: "a", Units: 600, Actual: 200}, ok),
			op(1, 40, 50, AccountInput{ID: "d", Units: 800}, ok),
		}, true},
		{"oversold: two concurrent 600s both admitted", []porcupine.Operation{
			op(0, 0, 10, AccountInput{ID: "a", Units: 600}, ok),
			op(1, 1, 11, AccountInput{ID: "b", Units: 600}, ok),
		}, false},
		{"rejected although it fit", []porcupine.Operation{
			op(0, 0, 10, AccountInput{ID: "a", Units: 200}, rejected),
		}, false},
		{"stale read: rejected after the settle that freed it returned", []porcupine.Operation{
			op(0, 0, 10, AccountInput{ID: "a", Units: 900}, ok),
			op(0, 20, 30, AccountInput{Settle: true, ID: "a", Units: 900, Actual: 0}, ok),
			op(1, 40, 50, AccountInput{ID: "b", Units: 900}, rejected),
		}, false},
		{"lost answer may have applied", []porcupine.Operation{
			op(0, 0, NeverReturned, AccountInput{ID: "a", Units: 600}, unknown),
			op(1, 20, 30, AccountInput{ID: "b", Units: 600}, rejected),
		}, true},
		{"lost answer may not have applied", []porcupine.Operation{
			op(0, 0, NeverReturned, AccountInput{ID: "a", Units: 600}, unknown),
			op(1, 20, 30, AccountInput{ID: "b", Units: 600}, ok),
		}, true},
	}
	for _, tc := range cases {
		got := porcupine.CheckOperations(AccountModel(1000), tc.ops)
		if got != tc.legal {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.legal)
		}
	}
}
