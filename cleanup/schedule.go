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
	return nextOnWallClock(c.sched, t, c.cfg.Location)
}

// nextOnWallClock returns the next time of s after t, reading the schedule
// on the wall clock of its time zone (the schedule's CRON_TZ, else loc), so
// that a daily schedule fires once on every day, clock changes included. A
// wall time the clocks skip (the spring-forward gap) fires when they jump
// past it, and a wall time they repeat (the fall-back hour) fires once, at
// its first occurrence. robfig/cron, left to itself, skips the first and
// fires the second twice: with the default 03:00, where the clocks jump from
// 03:00 to 04:00 (Eastern Europe), a day without a sweep every spring.
func nextOnWallClock(s cron.Schedule, t time.Time, loc *time.Location) time.Time {
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return s.Next(t.In(loc)) // @every: a fixed delay, no wall clock
	}
	if spec.Location != time.Local {
		loc = spec.Location
	}
	// The wall clock of t, as a UTC time: UTC has no clock changes.
	onWall := *spec
	onWall.Location = time.UTC
	wall := wallOf(t.In(loc))
	for {
		next := onWall.Next(wall)
		if next.IsZero() {
			return next
		}
		// In the second pass of a repeated hour, a time of that hour
		// already had its first occurrence, before t: the next one.
		if at := instantOfWall(next, loc); at.After(t) {
			return at
		}
		wall = next
	}
}

// instantOfWall returns the first instant in loc whose wall clock reads w
// (given as a UTC time), or, for a wall time that loc skips, the instant
// the clocks jump past it.
func instantOfWall(w time.Time, loc *time.Location) time.Time {
	c := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), loc)
	start, end := c.ZoneBounds()
	if !start.IsZero() {
		// A repeated wall time: the same reading under the offset in force
		// before c's zone period began is an earlier instant.
		_, off := start.Add(-time.Nanosecond).Zone()
		if e := w.Add(-time.Duration(off) * time.Second).In(loc); e.Before(start) && wallOf(e).Equal(w) {
			return e
		}
	}
	switch got := wallOf(c); {
	case got.Equal(w):
		return c
	case got.After(w):
		return start // c lies past the jump, which began its zone period
	default:
		return end // c lies before the jump, which ends its zone period
	}
}

// wallOf returns the wall clock reading of t as a UTC time.
func wallOf(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
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
