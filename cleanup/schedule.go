package cleanup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSchedule parses a Config.Schedule and checks that it fires at all.
func parseSchedule(spec string, loc *time.Location) (s cron.Schedule, err error) {
	defer func() {
		// robfig/cron v3.0.1 panics on some malformed CRON_TZ= prefixes.
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("Config.Schedule %q: malformed: %v", spec, r)
		}
	}()
	s, err = cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("Config.Schedule %q: %w", spec, err)
	}
	if f := strings.Fields(spec); len(f) >= 2 && f[len(f)-2] == "@every" {
		// robfig/cron turns any delay under 1s (zero, negative) into 1s.
		if d, err := time.ParseDuration(f[len(f)-1]); err == nil && d < time.Second {
			return nil, fmt.Errorf("Config.Schedule %q: the delay must be at least 1s", spec)
		}
	}
	if s.Next(time.Now().In(loc)).IsZero() {
		return nil, fmt.Errorf("Config.Schedule %q never fires", spec)
	}
	return s, nil
}

// wait waits d and reports false when ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Next returns when Run sweeps next after t.
func (c *Cleaner[TTx]) Next(t time.Time) time.Time {
	return c.sched.Next(t.In(c.cfg.Location))
}

// Run sweeps on Config.Schedule until ctx is done, then returns nil. Each
// scheduled sweep is a RunOnce: replicas that do not get the lease skip it.
// Sweep errors are logged (and passed to OnSweep), not returned: the next
// scheduled sweep tries again. A sweep in progress when ctx ends stops
// within one statement.
func (c *Cleaner[TTx]) Run(ctx context.Context) error {
	for {
		now := c.cfg.Now()
		next := c.Next(now)
		if next.IsZero() {
			return fmt.Errorf("cleanup: Schedule %q has no next run after %s", c.cfg.Schedule, now)
		}
		if !wait(ctx, next.Sub(now)) {
			return nil
		}
		if c.cfg.Now().Before(next) {
			continue // the timer fired early against Config.Now
		}
		_, _ = c.RunOnce(ctx) // logged and reported by RunOnce
		select {
		case <-ctx.Done():
			return nil
		default:
		}
	}
}

// CheckSchedule reports whether spec is a valid Config.Schedule (five cron
// fields or a descriptor such as @daily, firing at least once), so a
// program can reject a bad schedule while it parses its configuration,
// before it opens a database.
func CheckSchedule(spec string) error {
	_, err := parseSchedule(spec, time.Local)
	return err
}
