package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// doc is one input document: its JSON text and a name for tables.
type doc struct {
	name string
	raw  []byte
}

// Order lists: an e-commerce document of orders with random IDs and prices.
type OrderItem struct {
	SKU   string  `json:"sku"`
	Qty   int     `json:"qty"`
	Price float64 `json:"price"`
}

type Order struct {
	ID       string      `json:"id"`
	Customer int         `json:"cust"`
	Items    []OrderItem `json:"items"`
	Total    float64     `json:"total"`
	Status   string      `json:"status"`
	Created  int64       `json:"ts"`
}

type OrderList struct {
	Orders []Order `json:"orders"`
}

var statuses = []string{"paid", "shipped", "pending", "refunded", "delivered"}

// makeOrders returns the JSON of an order list of about size bytes (at least
// one order), the same for a given seed.
func makeOrders(seed uint64, size int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	var l OrderList
	n := len(`{"orders":[]}`)
	for n < size || len(l.Orders) == 0 {
		o := Order{
			ID:       fmt.Sprintf("o-%012x", r.Uint64()>>16),
			Customer: 10000 + r.IntN(90000),
			Status:   statuses[r.IntN(len(statuses))],
			Created:  1767225600 + int64(r.IntN(30*86400)),
		}
		for i := 0; i < 1+r.IntN(4); i++ {
			it := OrderItem{SKU: fmt.Sprintf("SKU-%05d", r.IntN(100000)), Qty: 1 + r.IntN(5), Price: float64(r.IntN(50000)) / 100}
			o.Items = append(o.Items, it)
			o.Total += float64(it.Qty) * it.Price
		}
		o.Total = float64(int(o.Total*100)) / 100
		if len(l.Orders) == 0 && size < 200 {
			o.Items = o.Items[:1]
		}
		b, _ := json.Marshal(o)
		l.Orders = append(l.Orders, o)
		n += len(b) + 1
	}
	b, err := json.Marshal(l)
	if err != nil {
		panic(err)
	}
	return b
}

// Message and Channel are a chat channel's recent messages, the documents
// packcache is for (the same shape as the root package's tests).
type Message struct {
	ID     int64     `json:"id"`
	Author string    `json:"author"`
	Text   string    `json:"text"`
	Sent   time.Time `json:"sent"`
	Likes  []string  `json:"likes,omitempty"`
}

type Channel struct {
	ID       string    `json:"id"`
	Title    string    `json:"title"`
	Messages []Message `json:"messages"`
}

// A few hundred common words, drawn with a Zipf distribution, so the text
// compresses like English rather than like a 50-word loop.
var wordList = strings.Fields(`
the of and to a in is you that it he was for on are as with his they I at be
this have from or one had by word but not what all were we when your can said
there use an each which she do how their if will up other about out many then
them these so some her would make like him into time has look two more write
go see number no way could people my than first water been call who oil its
now find long down day did get come made may part lecture notes exam tomorrow
room please read chapter question answer thanks professor deadline homework
assignment group project slides posted link meeting today week grade midterm
final review session office hours lab report submit draft feedback online
quiz problem set solution tutorial forum library thesis seminar schedule
cancelled moved extension late policy email announcement reminder course
syllabus textbook page section figure table example proof theorem lemma
definition exercise practice mock paper marks rubric criteria peer team
presentation demo code repository branch merge bug fix test build deploy
server database query index cache latency memory network request response
sorry hello everyone anyone know where when why because maybe sure okay great
awesome really very much also just still already again here soon later
morning afternoon evening night monday tuesday wednesday thursday friday`)

func sentence(r *rand.Rand, z *rand.Zipf, words int) string {
	var sb strings.Builder
	for w := 0; w < words; w++ {
		if w > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(wordList[z.Uint64()])
	}
	if r.IntN(3) == 0 {
		sb.WriteString("?")
	} else {
		sb.WriteString(".")
	}
	return sb.String()
}

// makeChannel builds a channel of about size bytes of JSON, the same for
// a given seed.
func makeChannel(seed uint64, size int) Channel {
	r := rand.New(rand.NewPCG(seed, 42))
	z := rand.NewZipf(r, 1.1, 2, uint64(len(wordList)-1))
	ch := Channel{ID: fmt.Sprintf("ch-%d", seed), Title: "Course announcements"}
	base := time.Date(2026, 9, 1, 8, 0, 0, 0, time.UTC)
	n := 50
	for i := 0; n < size; i++ {
		m := Message{
			ID:     int64(1_000_000 + i),
			Author: fmt.Sprintf("student%04d", r.IntN(5000)),
			Text:   sentence(r, z, 5+r.IntN(30)),
			Sent:   base.Add(time.Duration(i)*37*time.Second + time.Duration(r.IntN(1000))*time.Millisecond),
		}
		if r.IntN(4) == 0 {
			m.Likes = []string{fmt.Sprintf("student%04d", r.IntN(5000))}
		}
		ch.Messages = append(ch.Messages, m)
		b, _ := json.Marshal(m)
		n += len(b) + 1
	}
	return ch
}

// makeMessage returns the JSON of one chat message of exactly size bytes
// (or the smallest message possible, if size is below that).
func makeMessage(seed uint64, size int) []byte {
	r := rand.New(rand.NewPCG(seed, 99))
	z := rand.NewZipf(r, 1.1, 2, uint64(len(wordList)-1))
	m := Message{
		ID:     int64(1_000_000 + r.IntN(1000)),
		Author: fmt.Sprintf("student%04d", r.IntN(5000)),
		Sent:   time.Date(2026, 9, 1, 8, 0, 0, 0, time.UTC).Add(time.Duration(r.IntN(86400)) * time.Second),
	}
	b, _ := json.Marshal(m)
	need := size - len(b)
	var sb strings.Builder
	for sb.Len() < need {
		sb.WriteString(sentence(r, z, 5+r.IntN(12)))
		sb.WriteByte(' ')
	}
	m.Text = sb.String()[:max(need, 0)]
	b, _ = json.Marshal(m)
	return b
}

// loadCorpus reads every *.json file under dir.
func loadCorpus(dir string) ([]doc, error) {
	var docs []doc
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".json") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !json.Valid(b) {
			return fmt.Errorf("%s: not valid JSON", path)
		}
		rel, _ := filepath.Rel(dir, path)
		docs = append(docs, doc{name: rel, raw: b})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("-corpus %s: no *.json files", dir)
	}
	sort.Slice(docs, func(i, j int) bool { return len(docs[i].raw) < len(docs[j].raw) })
	return docs, nil
}

// corpusPieces returns, for each target size, a JSON object or array from
// inside the corpus documents whose compact encoding is closest to it
// (within 25%), so the threshold suite can run on real data.
func corpusPieces(docs []doc, sizes []int) []doc {
	best := make([]doc, len(sizes))
	var walk func(name string, v any)
	consider := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			return
		}
		for i, s := range sizes {
			d := abs(len(b) - s)
			if d*4 > s {
				continue
			}
			if best[i].raw == nil || d < abs(len(best[i].raw)-s) {
				best[i] = doc{name: name, raw: b}
			}
		}
	}
	walk = func(name string, v any) {
		switch t := v.(type) {
		case map[string]any:
			consider(name, t)
			for _, c := range t {
				walk(name, c)
			}
		case []any:
			consider(name, t)
			for _, c := range t {
				walk(name, c)
			}
		}
	}
	for _, d := range docs {
		var v any
		if json.Unmarshal(d.raw, &v) == nil {
			walk(d.name, v)
		}
	}
	var out []doc
	for _, d := range best {
		if d.raw != nil {
			out = append(out, d)
		}
	}
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
