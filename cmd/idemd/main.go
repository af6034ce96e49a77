package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal terminates at once
	}()
	os.Exit(app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
