// Package gen makes test data for the packcache command: chat channels of
// messages as JSON, of a chosen size, like the values a chat service would
// cache; and user profiles of a few hundred bytes, the small values that
// zstd dictionaries are for.
package gen

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// words is a small vocabulary; text draws from it with a Zipf-like skew, as
// chat does, so the channels compress like real text rather than like noise.
var words = strings.Fields(`the a to and i you it is that of in for on this be
we have are do not with just what so can but at was like get if go my up me
know all about now think will there out your one yes no ok lol thanks good
time how see would more when they well back here today meeting deploy build
review merge branch release ticket fixed broken test prod staging cache redis
latency error timeout retry queue worker config logs dashboard alert pager
customer issue update call lunch tomorrow monday week sprint plan doc draft
ship rollback metrics graph spike p99 cpu memory disk node cluster shard key`)

var users = func() []string {
	u := make([]string, 40)
	for i := range u {
		u[i] = fmt.Sprintf("user%03d", i*37%1000)
	}
	return u
}()

type message struct {
	ID        int64    `json:"id"`
	User      string   `json:"user"`
	TS        int64    `json:"ts"`
	Text      string   `json:"text"`
	Reactions []string `json:"reactions,omitempty"`
	Edited    bool     `json:"edited,omitempty"`
}

type channel struct {
	ID       int       `json:"id"`
	Name     string    `json:"name"`
	Topic    string    `json:"topic"`
	Members  []string  `json:"members"`
	Messages []message `json:"messages"`
}

// Channel returns the JSON of chat channel id holding messages until it is
// about size bytes (a little over, by at most one message).
func Channel(rng *rand.Rand, id, size int) []byte {
	c := channel{ID: id, Name: fmt.Sprintf("channel-%d", id), Topic: sentence(rng, 6)}
	for range 3 + rng.IntN(8) {
		c.Members = append(c.Members, users[rng.IntN(len(users))])
	}
	ts := int64(1_760_000_000_000) + rng.Int64N(1e9)
	n := 200 // the envelope
	for i := int64(1); n < size; i++ {
		ts += rng.Int64N(90_000)
		m := message{ID: int64(id)*1_000_000 + i, User: c.Members[rng.IntN(len(c.Members))], TS: ts, Text: sentence(rng, 3+rng.IntN(25))}
		if rng.IntN(6) == 0 {
			m.Reactions = []string{":+1:", ":tada:", ":eyes:"}[:1+rng.IntN(3)]
		}
		m.Edited = rng.IntN(20) == 0
		c.Messages = append(c.Messages, m)
		n += len(m.Text) + 80
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return b
}

func sentence(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		// Zipf-like: index = len * u^3 favours the first words.
		u := rng.Float64()
		b.WriteString(words[int(float64(len(words))*u*u*u)])
	}
	return b.String()
}

// LogUniform returns a size from lo to hi with a log-uniform distribution:
// as many values from 2 to 4 KB as from 64 to 128 KB.
func LogUniform(rng *rand.Rand, lo, hi int) int {
	return int(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
}

type profile struct {
	ID       int               `json:"id"`
	User     string            `json:"user"`
	Email    string            `json:"email,omitempty"`
	Plan     string            `json:"plan,omitempty"`
	Locale   string            `json:"locale,omitempty"`
	Joined   int64             `json:"joined,omitempty"`
	Verified bool              `json:"verified,omitempty"`
	Teams    []string          `json:"teams,omitempty"`
	Prefs    map[string]string `json:"prefs,omitempty"`
	Status   string            `json:"status,omitempty"`
}

// Profile returns the JSON of user profile id: field names and values
// that recur from one profile to the next, each optional part there three
// times in four, 200 bytes at the median, 30 (no optional part) to 400.
func Profile(rng *rand.Rand, id int) []byte {
	u := users[rng.IntN(len(users))]
	p := profile{ID: id, User: u}
	for part := range 6 {
		if rng.IntN(4) == 0 {
			continue
		}
		switch part {
		case 0:
			p.Email = u + "@example.com"
		case 1:
			p.Plan, p.Locale = []string{"free", "pro", "team"}[rng.IntN(3)], []string{"en-US", "de-DE", "fr-FR", "ja-JP"}[rng.IntN(4)]
		case 2:
			p.Joined, p.Verified = 1.6e9+rng.Int64N(1e8), rng.IntN(3) > 0
		case 3:
			p.Teams = []string{"platform", "payments", "search", "mobile"}[:1+rng.IntN(4)]
		case 4:
			p.Prefs = map[string]string{"theme": []string{"dark", "light"}[rng.IntN(2)], "digest": "weekly", "tz": "UTC"}
		case 5:
			p.Status = sentence(rng, 3+rng.IntN(12))
		}
	}
	b, _ := json.Marshal(p)
	return b
}
