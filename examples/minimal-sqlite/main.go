// Command minimal-sqlite is the smallest embedding of the lock module on
// SQLite: open a file, hold a lock while doing some work, close. It is
// what docs/operations.md measures (packages linked, binary size, cold
// build time); it takes the database file as its argument.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/cleveragents/locks"
	"github.com/cleveragents/locks/application"
	"github.com/cleveragents/locks/domain"
)

func main() {
	ctx := context.Background()
	c, err := locks.Open(ctx, locks.Config{Database: os.Args[1]})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	plan := domain.ResourceRef{Type: domain.ResourcePlan, ID: "demo"}
	err = c.Locks.Do(ctx, c.Owner(), plan, application.AcquireOptions{}, func(ctx context.Context, l domain.Lock) error {
		fmt.Println("holding", l.Resource, "token", l.Token)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
