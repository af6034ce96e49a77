package cleanup

import "time"

// SetHostClock makes c's default clock read the host's time from wall (a
// host whose clock is off); it panics if c was given a Config.Now.
func (c *Cleaner[TTx]) SetHostClock(wall func() time.Time) {
	c.clock.SetHostClock(wall)
}
