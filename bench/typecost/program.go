package main

import (
	"bytes"
	"fmt"
	"go/format"
	"strings"
)

// A docType is one document type of the generated programs: its name,
// its declaration (with the types it nests) and the key prefix its calls
// use.
type docType struct {
	name, key, decl string
}

// docTypes are the twelve struct types, of different shapes as real
// document types are. The one-type program uses the first.
var docTypes = []docType{
	{"Channel", "channel", `
type Channel struct {
	ID       int64     ` + "`json:\"id\"`" + `
	Name     string    ` + "`json:\"name\"`" + `
	Topic    string    ` + "`json:\"topic\"`" + `
	Members  []int64   ` + "`json:\"members\"`" + `
	Messages []Message ` + "`json:\"messages\"`" + `
	Updated  time.Time ` + "`json:\"updated\"`" + `
}

type Message struct {
	ID        int64          ` + "`json:\"id\"`" + `
	Author    string         ` + "`json:\"author\"`" + `
	Text      string         ` + "`json:\"text\"`" + `
	Sent      time.Time      ` + "`json:\"sent\"`" + `
	Reactions map[string]int ` + "`json:\"reactions,omitempty\"`" + `
}`},
	{"Order", "order", `
type Order struct {
	ID       string      ` + "`json:\"id\"`" + `
	Customer int64       ` + "`json:\"customer\"`" + `
	Lines    []OrderLine ` + "`json:\"lines\"`" + `
	Total    float64     ` + "`json:\"total\"`" + `
	Paid     bool        ` + "`json:\"paid\"`" + `
	Placed   time.Time   ` + "`json:\"placed\"`" + `
	Notes    *string     ` + "`json:\"notes,omitempty\"`" + `
}

type OrderLine struct {
	SKU   string  ` + "`json:\"sku\"`" + `
	Qty   int     ` + "`json:\"qty\"`" + `
	Price float64 ` + "`json:\"price\"`" + `
}`},
	{"Product", "product", `
type Product struct {
	SKU         string            ` + "`json:\"sku\"`" + `
	Title       string            ` + "`json:\"title\"`" + `
	Description string            ` + "`json:\"description\"`" + `
	Price       float64           ` + "`json:\"price\"`" + `
	Stock       int32             ` + "`json:\"stock\"`" + `
	Tags        []string          ` + "`json:\"tags\"`" + `
	Attributes  map[string]string ` + "`json:\"attributes\"`" + `
	Images      []string          ` + "`json:\"images\"`" + `
}`},
	{"UserProfile", "user", `
type UserProfile struct {
	ID       int64           ` + "`json:\"id\"`" + `
	Email    string          ` + "`json:\"email\"`" + `
	Name     string          ` + "`json:\"name\"`" + `
	Roles    []string        ` + "`json:\"roles\"`" + `
	Settings map[string]bool ` + "`json:\"settings\"`" + `
	Created  time.Time       ` + "`json:\"created\"`" + `
	LastSeen *time.Time      ` + "`json:\"last_seen,omitempty\"`" + `
	Score    float32         ` + "`json:\"score\"`" + `
}`},
	{"Article", "article", `
type Article struct {
	Slug      string    ` + "`json:\"slug\"`" + `
	Title     string    ` + "`json:\"title\"`" + `
	Body      string    ` + "`json:\"body\"`" + `
	Authors   []string  ` + "`json:\"authors\"`" + `
	Published time.Time ` + "`json:\"published\"`" + `
	Sections  []Section ` + "`json:\"sections\"`" + `
	Views     uint64    ` + "`json:\"views\"`" + `
}

type Section struct {
	Heading string ` + "`json:\"heading\"`" + `
	Text    string ` + "`json:\"text\"`" + `
	Order   int    ` + "`json:\"order\"`" + `
}`},
	{"Invoice", "invoice", `
type Invoice struct {
	Number    string        ` + "`json:\"number\"`" + `
	Issuer    Party         ` + "`json:\"issuer\"`" + `
	Recipient Party         ` + "`json:\"recipient\"`" + `
	Items     []InvoiceItem ` + "`json:\"items\"`" + `
	Due       time.Time     ` + "`json:\"due\"`" + `
	Currency  string        ` + "`json:\"currency\"`" + `
}

type Party struct {
	Name    string ` + "`json:\"name\"`" + `
	Address string ` + "`json:\"address\"`" + `
	VAT     string ` + "`json:\"vat\"`" + `
}

type InvoiceItem struct {
	Desc    string  ` + "`json:\"desc\"`" + `
	Amount  int64   ` + "`json:\"amount\"`" + `
	TaxRate float64 ` + "`json:\"tax_rate\"`" + `
}`},
	{"Session", "session", `
type Session struct {
	Token   string         ` + "`json:\"token\"`" + `
	UserID  int64          ` + "`json:\"user_id\"`" + `
	Expires time.Time      ` + "`json:\"expires\"`" + `
	Data    map[string]any ` + "`json:\"data\"`" + `
	IP      string         ` + "`json:\"ip\"`" + `
	Agent   string         ` + "`json:\"agent\"`" + `
}`},
	{"Timeline", "timeline", `
type Timeline struct {
	Owner  int64   ` + "`json:\"owner\"`" + `
	Events []Event ` + "`json:\"events\"`" + `
	Cursor string  ` + "`json:\"cursor\"`" + `
}

type Event struct {
	Kind    string          ` + "`json:\"kind\"`" + `
	At      time.Time       ` + "`json:\"at\"`" + `
	Ref     int64           ` + "`json:\"ref\"`" + `
	Payload json.RawMessage ` + "`json:\"payload\"`" + `
}`},
	{"Catalog", "catalog", `
type Catalog struct {
	ID         int                 ` + "`json:\"id\"`" + `
	Categories map[string][]string ` + "`json:\"categories\"`" + `
	Featured   [8]int64            ` + "`json:\"featured\"`" + `
	Updated    time.Time           ` + "`json:\"updated\"`" + `
}`},
	{"GeoFeature", "geo", `
type GeoFeature struct {
	ID          string            ` + "`json:\"id\"`" + `
	Type        string            ` + "`json:\"type\"`" + `
	Coordinates [][2]float64      ` + "`json:\"coordinates\"`" + `
	Properties  map[string]string ` + "`json:\"properties\"`" + `
	BBox        [4]float64        ` + "`json:\"bbox\"`" + `
}`},
	{"Leaderboard", "leaderboard", `
type Leaderboard struct {
	Game     string    ` + "`json:\"game\"`" + `
	Season   int16     ` + "`json:\"season\"`" + `
	Entries  []Entry   ` + "`json:\"entries\"`" + `
	Computed time.Time ` + "`json:\"computed\"`" + `
}

type Entry struct {
	Player  string  ` + "`json:\"player\"`" + `
	Points  int64   ` + "`json:\"points\"`" + `
	Rank    int     ` + "`json:\"rank\"`" + `
	Country [2]byte ` + "`json:\"country\"`" + `
}`},
	{"ServiceConfig", "config", `
type ServiceConfig struct {
	Service   string          ` + "`json:\"service\"`" + `
	Version   int             ` + "`json:\"version\"`" + `
	Flags     map[string]bool ` + "`json:\"flags\"`" + `
	Limits    Limits          ` + "`json:\"limits\"`" + `
	Endpoints []string        ` + "`json:\"endpoints\"`" + `
	Owners    []*Contact      ` + "`json:\"owners\"`" + `
}

type Limits struct {
	RPS     int           ` + "`json:\"rps\"`" + `
	Burst   int           ` + "`json:\"burst\"`" + `
	Timeout time.Duration ` + "`json:\"timeout\"`" + `
}

type Contact struct {
	Name  string ` + "`json:\"name\"`" + `
	Email string ` + "`json:\"email\"`" + `
}`},
}

// use is the code each type gets: every call of issue 23's list on a
// Cache of it.
const use = `
func use%[1]s(ctx context.Context, rdb redis.UniversalClient) error {
	c, err := packcache.New[%[1]s](rdb)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Set(ctx, "%[2]s:1", %[1]s{}); err != nil {
		return err
	}
	v, err := c.Get(ctx, "%[2]s:1")
	if err != nil {
		return err
	}
	m, err := c.GetMany(ctx, []string{"%[2]s:1", "%[2]s:2"})
	if err != nil {
		return err
	}
	w, err := c.GetOrLoad(ctx, "%[2]s:3", func(ctx context.Context) (%[1]s, error) { return v, nil })
	if err != nil {
		return err
	}
	sink = append(sink, v, m, w)
	return nil
}
`

// program returns the source of a program that uses Cache[T] for each of
// types. It is built to be measured; run without arguments it does
// nothing, and it never picks a Redis address of its own.
func program(types []docType) []byte {
	var b bytes.Buffer
	b.WriteString(`// Code generated by typecost; DO NOT EDIT.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/packcache/packcache"
)

var (
	_ json.RawMessage
	_ time.Time
)

var sink []any

func main() {
	if len(os.Args) != 2 {
		fmt.Println("built to be measured; run with a Redis address to exercise it")
		return
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{os.Args[1]}})
	defer rdb.Close()
	ctx := context.Background()
	for _, f := range []func(context.Context, redis.UniversalClient) error{
`)
	for _, t := range types {
		fmt.Fprintf(&b, "\t\tuse%s,\n", t.name)
	}
	b.WriteString("\t} {\n\t\tif err := f(ctx, rdb); err != nil {\n\t\t\tfmt.Fprintln(os.Stderr, err)\n\t\t\tos.Exit(1)\n\t\t}\n\t}\n}\n")
	for _, t := range types {
		b.WriteString(strings.TrimPrefix(t.decl, "\n"))
		b.WriteString("\n")
		fmt.Fprintf(&b, use, t.name, t.key)
	}
	src, err := format.Source(b.Bytes())
	if err != nil {
		panic(fmt.Sprintf("typecost: generated program: %v\n%s", err, b.Bytes()))
	}
	return src
}
