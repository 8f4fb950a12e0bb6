package msgpack_test

import "encoding/json"

// stdJSON is a Serializer over encoding/json, the other JSON reader the
// tests set msgpack values before.
type stdJSON struct{}

func (stdJSON) Marshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(dst, b...), err
}
func (stdJSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (stdJSON) Text() bool                         { return true }
