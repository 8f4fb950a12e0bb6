package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/packcache/packcache/codec"
)

// advise --train: a zstd dictionary trained on half the sampled values,
// and the other half measured with and without it.

// dictionaryAdvice is what advise --train reports of the dictionary; it
// is also its part of the --json report.
type dictionaryAdvice struct {
	d *codec.Dictionary

	ID            string  `json:"id"`  // 8 hex digits
	Key           string  `json:"key"` // where readers look for it in Redis
	Bytes         int     `json:"bytes"`
	File          string  `json:"file"`
	TrainedOn     int     `json:"trained_on"`  // sampled values
	MeasuredOn    int     `json:"measured_on"` // the other sampled values
	With          string  `json:"with"`        // the best codec with the dictionary
	StoredWith    float64 `json:"projected_stored_bytes_with"`
	MemoryWith    float64 `json:"projected_memory_bytes_with"`
	Without       string  `json:"without"` // the best codec without it
	StoredWithout float64 `json:"projected_stored_bytes_without"`
	MemoryWithout float64 `json:"projected_memory_bytes_without"`
	Policy        string  `json:"policy"`
	Published     bool    `json:"published"`
}

// split deals the measured values into a half to train on and a half to
// measure, and scales memOther, the memory of the sampled values that are
// not measured, to the half measured.
func split(values []sampled, memOther float64) (train, test []sampled, other float64, err error) {
	if len(values) < 10 {
		return nil, nil, 0, fmt.Errorf("--train: %d decodable values sampled; training needs at least 10 (5 to train on, 5 to measure)", len(values))
	}
	for i, v := range values {
		if i%2 == 0 {
			train = append(train, v)
		} else {
			test = append(test, v)
		}
	}
	return train, test, memOther * float64(len(test)) / float64(len(values)), nil
}

// trainDictionary trains the dictionary on train, for measuring on
// measured values.
func trainDictionary(train []sampled, measured int, o adviseOptions) (*dictionaryAdvice, error) {
	samples := make([][]byte, len(train))
	for i, v := range train {
		samples[i] = v.decoded
	}
	b, err := codec.TrainDictionary(samples, o.dictSize)
	if err != nil {
		return nil, fmt.Errorf("--train: %w", err)
	}
	d, err := codec.ParseDictionary(b)
	if err != nil {
		return nil, fmt.Errorf("--train: %w", err)
	}
	da := &dictionaryAdvice{d: d, ID: fmt.Sprintf("%08x", d.ID()), Key: codec.DictionaryKey(d.ID()), Bytes: len(b),
		File: o.dictOut, TrainedOn: len(train), MeasuredOn: measured}
	if da.File == "" {
		da.File = da.ID + ".dict"
	}
	return da, nil
}

func zstdChoice(level int) choice {
	return choice{name: "zstd", level: level, c: codec.ZstdLevel(level)}
}

// finish compares the best codec with the dictionary and the best without,
// each by the rule of the recommendation, writes the dictionary's file and,
// with --publish, stores it in Redis.
func (da *dictionaryAdvice) finish(ctx context.Context, c *conn, results []*result, o adviseOptions) error {
	var with, without []*result
	for _, r := range results {
		if r.choice.dict != nil {
			with = append(with, r)
		} else {
			without = append(without, r)
		}
	}
	w, wo := bestOf(with), bestOf(without)
	da.With, da.StoredWith, da.MemoryWith = w.Codec, w.Stored, w.Memory
	da.Without, da.StoredWithout, da.MemoryWithout = wo.Codec, wo.Stored, wo.Memory
	t := target{choice: w.choice, above: w.Above}
	if w.Above < 0 {
		t.above = never
	}
	da.Policy = t.policyLiteral()
	if err := os.WriteFile(da.File, da.d.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--dictionary-out: %w", err)
	}
	if o.publish {
		if err := publishDictionary(ctx, c.rdb, da.d); err != nil {
			return err
		}
		da.Published = true
	}
	return nil
}

// bestOf is the result the recommendation's rule picks among rs, or the
// one of least memory if none is within the bounds.
func bestOf(rs []*result) *result {
	if r := recommend(rs); r != nil {
		return r
	}
	best := rs[0]
	for _, r := range rs {
		if r.Memory < best.Memory {
			best = r
		}
	}
	return best
}

func (da *dictionaryAdvice) print(w io.Writer) {
	fmt.Fprintf(w, "\ndictionary: %s, id %s, trained on %d sampled values and measured on the other %d; written to %s\n",
		counted(int64(da.Bytes), "byte"), da.ID, da.TrainedOn, da.MeasuredOn, da.File)
	fmt.Fprintf(w, "  with it:    %s projects %s of Redis memory (the measured values: %s stored)\n", da.With, bytesIEC(da.MemoryWith), bytesIEC(da.StoredWith))
	fmt.Fprintf(w, "  without it: %s projects %s (the measured values: %s stored)\n", da.Without, bytesIEC(da.MemoryWithout), bytesIEC(da.StoredWithout))
	fmt.Fprintf(w, "\n  %s\n", da.Policy)
	fmt.Fprintf(w, "  // dict: the bytes of %s (os.ReadFile, or //go:embed)\n\n", da.File)
	if da.Published {
		fmt.Fprintf(w, "  published as %s, where readers that lack it find it\n", da.Key)
	} else {
		fmt.Fprintf(w, "  not published: --publish stores it as %s; a writer with it in its Policy publishes it before its first write\n", da.Key)
	}
}
