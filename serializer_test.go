package packcache_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/packcache/packcache"
)

// corpusDir is the public JSON benchmark corpus beside the repository, as
// laid out on developers' machines and in CI, or PACKCACHE_CORPUS.
func corpusDir(t testing.TB) string {
	dir := os.Getenv("PACKCACHE_CORPUS")
	if dir == "" {
		dir = filepath.Join("..", "shared", "corpus")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no JSON corpus at %s (set PACKCACHE_CORPUS): %v", dir, err)
	}
	return dir
}

// TestJSONMatchesStdlib is the compatibility evidence for the default
// serializer: on every corpus document, and on our own documents, it
// decodes to exactly what encoding/json decodes, and each reads the
// other's output.
func TestJSONMatchesStdlib(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(filepath.Join(corpusDir(t), "*.json"))
	if len(files) == 0 {
		t.Skip("corpus is empty")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var std, fast any
		if err := packcache.StdJSON.Unmarshal(data, &std); err != nil {
			t.Fatalf("%s: encoding/json: %v", f, err)
		}
		if err := packcache.JSON.Unmarshal(data, &fast); err != nil {
			t.Fatalf("%s: default JSON: %v", f, err)
		}
		if !reflect.DeepEqual(std, fast) {
			t.Fatalf("%s: the default JSON serializer decodes differently from encoding/json", f)
		}
		out, err := packcache.JSON.Marshal(nil, &fast)
		if err != nil {
			t.Fatal(err)
		}
		var back any
		if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, std) {
			t.Fatalf("%s: encoding/json does not read the default serializer's output back: %v", f, err)
		}
	}
}

func TestJSONMatchesStdlibTyped(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 500, 40 << 10, 128 << 10} {
		ch := makeChannel(uint64(size), size)
		a, err := packcache.JSON.Marshal(nil, &ch)
		if err != nil {
			t.Fatal(err)
		}
		b, err := packcache.StdJSON.Marshal(nil, &ch)
		if err != nil {
			t.Fatal(err)
		}
		var fromA, fromB Channel
		if err := packcache.StdJSON.Unmarshal(a, &fromA); err != nil {
			t.Fatal(err)
		}
		if err := packcache.JSON.Unmarshal(b, &fromB); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fromA, ch) || !reflect.DeepEqual(fromB, ch) {
			t.Fatalf("size %d: serializers disagree", size)
		}
	}
	// Both reject what is not JSON, or not the right type.
	for _, bad := range []string{`{"id":`, `[1,2]`, `{"id": 5}`, "\xff", `{"messages":[{"id":"x"}]}`, `{} trailing`} {
		var a, b Channel
		errA := packcache.JSON.Unmarshal([]byte(bad), &a)
		errB := packcache.StdJSON.Unmarshal([]byte(bad), &b)
		if (errA == nil) != (errB == nil) {
			t.Errorf("%q: default JSON error %v, encoding/json error %v", bad, errA, errB)
		}
	}
}
