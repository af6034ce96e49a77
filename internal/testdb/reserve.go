package testdb

import "context"

// ReserveConns takes n of the tests' PostgreSQL connection slots for
// connections that do not go through this package's dialer, such as a
// child process's pools (an idemd replica), so that they count against the
// server's max_connections with the tests' own. It waits like a pool's
// dial does (at most two minutes, or until ctx ends). release gives the
// slots back; call it once the connections are closed (the process
// exited).
func ReserveConns(ctx context.Context, n int) (release func(), err error) {
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for range n {
		r, err := acquireSlot(ctx)
		if err != nil {
			release()
			return func() {}, err
		}
		releases = append(releases, r)
	}
	return release, nil
}
