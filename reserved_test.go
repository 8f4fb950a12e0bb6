package packcache_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/packcache/packcache"
	"github.com/packcache/packcache/codec"
)

// TestReservedKeysRefused: every call that names one of the cache's own
// keys (the groups' sequence and records, a dictionary, anything under
// the reserved prefixes) fails with an error matching ErrReservedKey that
// names the key, calls no loader, and leaves Redis as it was: the key
// itself, and the ordinary keys named beside it in a batch.
func TestReservedKeysRefused(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	var loads atomic.Int64
	c := mustNew[string](t, rdb, packcache.WithLoader(packcache.LoaderFunc[string](func(context.Context, string) (string, error) {
		loads.Add(1)
		return "loaded", nil
	})))
	load := func(context.Context) (string, error) { loads.Add(1); return "loaded", nil }
	loadMany := func(_ context.Context, keys []string) (map[string]string, error) {
		loads.Add(1)
		m := map[string]string{}
		for _, k := range keys {
			m[k] = "loaded"
		}
		return m, nil
	}
	reserved := []string{"{packcache:g}seq", "{packcache:g}:user:42", codec.DictionaryKey(0x00ab12cd), "packcache:anything", "{packcache:x}y"}
	const plain = "plain:1"
	for _, k := range reserved {
		if !packcache.Reserved(k) {
			t.Fatalf("Reserved(%q) = false", k)
		}
		before := []byte("7") // what the cache's own state might hold
		if err := rdb.Set(ctx, k, before, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, plain, `"old"`, 0).Err(); err != nil {
			t.Fatal(err)
		}
		check := func(call string, err error) {
			t.Helper()
			var pe *packcache.Error
			if !errors.Is(err, packcache.ErrReservedKey) || !errors.As(err, &pe) || pe.Key != k {
				t.Errorf("%s of %q: %v, want an *Error naming it, matching ErrReservedKey", call, k, err)
			}
			if got := rawGet(t, rdb, k); string(got) != string(before) {
				t.Errorf("after %s, Redis holds %q under %q, want %q", call, got, k, before)
			}
			if got := rawGet(t, rdb, plain); string(got) != `"old"` {
				t.Errorf("after %s of %q, Redis holds %q under %q, want it unchanged", call, k, got, plain)
			}
		}
		check("Set", c.Set(ctx, k, "v"))
		check("SetMany", c.SetMany(ctx, map[string]string{k: "v", plain: "new"}))
		check("Delete", c.Delete(ctx, k))
		check("Delete of two", c.Delete(ctx, plain, k))
		_, err := c.Get(ctx, k)
		check("Get", err)
		_, err = c.GetOrLoad(ctx, k, load)
		check("GetOrLoad", err)
		m, err := c.GetMany(ctx, []string{plain, k})
		check("GetMany", err)
		if len(m) != 0 {
			t.Errorf("GetMany with %q returned %v, want nothing", k, m)
		}
		_, err = c.GetOrLoadMany(ctx, []string{k, plain}, loadMany)
		check("GetOrLoadMany", err)

		rec := httptest.NewRecorder()
		c.Serve(rec, httptest.NewRequest(http.MethodGet, "/", nil), k)
		if rec.Code != http.StatusNotFound || strings.Contains(rec.Body.String(), "7") {
			t.Errorf("Serve of %q: %d %q, want 404 without the key's content", k, rec.Code, rec.Body.String())
		}
		if got := rawGet(t, rdb, k); string(got) != string(before) {
			t.Errorf("after Serve, Redis holds %q under %q, want %q", got, k, before)
		}
	}
	if n := loads.Load(); n != 0 {
		t.Errorf("%d loads for reserved keys, want 0", n)
	}
	for _, k := range []string{"packcache", "packcache-x", "{packcache}", "x:packcache:dict:1", "Packcache:dict:1"} {
		if packcache.Reserved(k) {
			t.Errorf("Reserved(%q) = true, want false", k)
		}
	}
}

// TestCacheKeysAreReserved: every key the cache writes for itself (the
// groups' state, a dictionary) is one that Reserved names, so that no
// call of a user's can write it.
func TestCacheKeysAreReserved(t *testing.T) {
	t.Parallel()
	_, rdb := single(t)
	ctx := ctxT(t)
	c := mustNew[json.RawMessage](t, rdb, packcache.WithPrefix("d:", packcache.Policy{Dictionary: profileDictionary(t, 1)}))
	mine := map[string]bool{}
	for i, v := range profiles(20, 2) {
		k := "d:" + string(rune('a'+i))
		mine[k] = true
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, k, b, packcache.InGroups("g1", "g2")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.InvalidateGroups(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "d:z", json.RawMessage(`{"a":1}`), packcache.InGroups("g1")); err != nil {
		t.Fatal(err)
	}
	mine["d:z"] = true
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, k := range keys {
		if mine[k] {
			continue
		}
		own = append(own, k)
		if !packcache.Reserved(k) {
			t.Errorf("the cache wrote %q, which Reserved does not name", k)
		}
	}
	slices.Sort(own)
	if !slices.ContainsFunc(own, func(k string) bool { return strings.HasPrefix(k, "packcache:dict:") }) || !slices.Contains(own, "{packcache:g}seq") {
		t.Errorf("the cache's own keys %q lack a dictionary or the group sequence: the test tests nothing", own)
	}
}
