package app

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/idemkit/idem/problem"
)

// healthz answers {"status":"ok"} when the database answers a ping within
// 2s, and a 503 problem otherwise.
func (a *App) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.ping(ctx); err != nil {
		a.log.WarnContext(ctx, "health check failed", "err", err)
		w.Header().Set("Retry-After", "5")
		problem.WriteError(w, http.StatusServiceUnavailable, "", "Database unavailable", "The database did not answer a ping.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// livez answers {"status":"ok"} while the process serves HTTP, without
// looking at the database: a liveness probe. /healthz is the readiness
// probe: a database outage takes every replica out of the load balancer,
// and restarting them all (a liveness probe on /healthz) would not help.
func (a *App) livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// kafkaInfo answers where the order events are, for clients such as idemd
// demo: {"mode":"embedded"|"brokers"|"off","seeds":["host:port",...],
// "topic":"..."}. The seeds of the embedded broker are its listen address.
func (a *App) kafkaInfo(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(struct {
		Mode  string   `json:"mode"`
		Seeds []string `json:"seeds"`
		Topic string   `json:"topic"`
	}{a.cfg.Kafka.Mode, append([]string{}, a.kafkaSeeds...), a.cfg.KafkaTopic})
}
