package packcache

import "strings"

// The keys the cache keeps for itself. Every key the cache writes other
// than the caller's own begins with one of reservedPrefixes: the groups'
// sequence and records ({packcache:g}, groups.go), the dictionaries
// (packcache:dict:, codec.DictionaryKey), and whatever a later release
// keeps beside them. A call that names such a key is refused before it
// reads or writes anything (checkKeys), so that no Set, SetMany, Delete
// or load can change the cache's own state, and no Get can hand it out as
// a value.
var reservedPrefixes = [...]string{"packcache:", "{packcache:"}

// Reserved reports whether key is one the cache keeps for itself: it
// begins with "packcache:" or "{packcache:". Every call that names such a
// key (Get, GetOrLoad, GetMany, GetOrLoadMany, Set, SetMany, Delete,
// Serve) fails as a whole, before it reads or writes anything, with an
// error naming the key and matching ErrReservedKey; Serve answers it with
// 404 Not Found.
func Reserved(key string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// checkKeys refuses a call of op naming a key the cache keeps for itself:
// an *Error naming the first such key, matching ErrReservedKey.
func checkKeys(op string, keys ...string) error {
	for _, k := range keys {
		if Reserved(k) {
			return keyErr(op, k, ErrReservedKey)
		}
	}
	return nil
}
