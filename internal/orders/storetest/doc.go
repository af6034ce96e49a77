// Package storetest is the suite every orders.Store must pass, run by the
// tests of pgstore and sqlitestore against a real database.
package storetest
