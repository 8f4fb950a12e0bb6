module github.com/packcache/packcache/bench

go 1.26.0

replace github.com/packcache/packcache => ../

// The brotli codec and the msgpack serializer are modules of their own,
// measured beside the built-in codecs and packcache.JSON.
replace (
	github.com/packcache/packcache/brotli => ../brotli
	github.com/packcache/packcache/msgpack => ../msgpack
)

require (
	github.com/go-redis/cache/v9 v9.0.0
	github.com/packcache/packcache v0.2.0
	github.com/packcache/packcache/brotli v0.0.0-00010101000000-000000000000
	github.com/packcache/packcache/msgpack v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/redis/rueidis/rueidisaside v1.0.76
)

require (
	github.com/andybalholm/brotli v1.3.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/goccy/go-json v0.12.0 // indirect
	github.com/golang/snappy v1.0.0 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/vmihailenco/go-tinylfu v0.2.2 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
