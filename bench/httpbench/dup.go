package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
)

// dupTarget is one route under the duplicates experiment.
type dupTarget struct {
	name string
	// paths: the k requests of a key go to these in turn (two paths:
	// two instances).
	paths  []string
	prefix string // key prefix, to count its business rows afterwards
	// answers counts the answers by kind ("201", "201 replayed", "409", ...).
	answers map[string]int
}

// dupResult is what the business table says about one target.
type dupResult struct {
	keys       int // distinct keys sent
	executed   int // business rows written
	dupKeys    int // keys that executed more than once
	unexecuted int // keys that never executed (every request failed)
}

// duplicates sends k identical requests at once for each of d keys to every
// target, then counts the business rows per key. Targets take turns key by
// key, so both see the same machine.
func duplicates(ctx context.Context, hc *http.Client, baseURL string, pool *pgxpool.Pool, targets []*dupTarget, d, k int) ([]dupResult, error) {
	var mu sync.Mutex
	for i := range d {
		for j := range targets {
			t := targets[(i+j)%len(targets)] // alternate who goes first
			req := request{n: int64(i), key: fmt.Sprintf("%s%d", t.prefix, i), body: paymentBody(int64(i))}
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for r := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					status, h, _, err := send(ctx, hc, baseURL+t.paths[r%len(t.paths)], req)
					kind := fmt.Sprint(status)
					switch {
					case err != nil:
						kind = "transport error"
					case h.Get(idemhttp.ReplayedHeader) == "true":
						kind += " replayed"
					}
					mu.Lock()
					t.answers[kind]++
					mu.Unlock()
				}()
			}
			close(gate)
			wg.Wait()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}

	res := make([]dupResult, len(targets))
	for j, t := range targets {
		rows, err := pool.Query(ctx, `SELECT idem_key, count(*) FROM payment
			WHERE starts_with(idem_key, $1) GROUP BY idem_key`, t.prefix)
		if err != nil {
			return nil, fmt.Errorf("count executions: %w", err)
		}
		r := dupResult{keys: d}
		seen := 0
		for rows.Next() {
			var (
				key string
				n   int
			)
			if err := rows.Scan(&key, &n); err != nil {
				rows.Close()
				return nil, err
			}
			seen++
			r.executed += n
			if n > 1 {
				r.dupKeys++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("count executions: %w", err)
		}
		r.unexecuted = d - seen
		res[j] = r
	}
	return res, nil
}

// answerSummary formats the answers of a target, most frequent first.
func answerSummary(m map[string]int) string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if m[kinds[i]] != m[kinds[j]] {
			return m[kinds[i]] > m[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d x %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
