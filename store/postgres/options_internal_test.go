package postgres

import (
	"maps"
	"testing"
)

func TestOptionsSettingsReadsEveryFormTheServerReads(t *testing.T) {
	cases := []struct {
		options string
		want    map[string]string
	}{
		{"", map[string]string{}},
		{"-c plan_cache_mode=force_custom_plan", map[string]string{"plan_cache_mode": "force_custom_plan"}},
		{"-cplan_cache_mode=auto", map[string]string{"plan_cache_mode": "auto"}},
		{"--plan-cache-mode=auto", map[string]string{"plan_cache_mode": "auto"}},
		{"  -c lock_timeout=1s\t-c Idle_In_Transaction_Session_Timeout=0 ", map[string]string{
			"lock_timeout": "1s", "idle_in_transaction_session_timeout": "0"}},
		{`-c application_name=a\ b -c lock_timeout=2s`, map[string]string{"application_name": "a b", "lock_timeout": "2s"}},
		{"-B 8 -c", map[string]string{}},
		{"-c =x -c novalue", map[string]string{}},
	}
	for _, c := range cases {
		if got := optionsSettings(c.options); !maps.Equal(got, c.want) {
			t.Errorf("optionsSettings(%q) = %v, want %v", c.options, got, c.want)
		}
	}
}

func TestSessionDefaultsYieldToTheDSNsOptions(t *testing.T) {
	t.Run("options in the DSN", func(t *testing.T) {
		t.Setenv("PGOPTIONS", "")
		checkDefaultsYield(t, "postgres://u@127.0.0.1/db?options=-c%20plan_cache_mode%3Dauto%20-c%20lock_timeout%3D1s")
	})
	t.Run("a parameter spelled in another case", func(t *testing.T) {
		t.Setenv("PGOPTIONS", "")
		checkDefaultsYield(t, "postgres://u@127.0.0.1/db?Plan_Cache_Mode=auto&LOCK_TIMEOUT=1s")
	})
	t.Run("PGOPTIONS", func(t *testing.T) {
		t.Setenv("PGOPTIONS", "-c plan_cache_mode=auto --lock-timeout=1s")
		checkDefaultsYield(t, "postgres://u@127.0.0.1/db")
	})
}

// checkDefaultsYield checks that the store sends neither plan_cache_mode
// nor lock_timeout beside options that set them (the startup parameters
// would win), nor chooses plan_cache_mode per statement, and still sends
// the defaults the options leave unset.
func checkDefaultsYield(t *testing.T, dsn string) {
	t.Helper()
	cfg, perStatement, err := parseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plan_cache_mode", "lock_timeout"} {
		if v, sent := cfg.ConnConfig.RuntimeParams[name]; sent {
			t.Errorf("the store sends %s=%s beside the options, overriding them", name, v)
		}
	}
	if perStatement {
		t.Error("the store sets plan_cache_mode per statement though the options set it")
	}
	if cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] != "30s" {
		t.Error("a default the options leave unset is not sent")
	}
}
