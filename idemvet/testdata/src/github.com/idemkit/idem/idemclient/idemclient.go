// Package idemclient is a stub of idem's idemclient for the idemvet tests.
package idemclient

import "net/http"

const HeaderKey = "Idempotency-Key"

type Client struct{}

func NewKey() (string, error)                                      { return "", nil }
func WithKey(req *http.Request, key string) (*http.Request, error) { return req, nil }
func (*Client) NewKey() (string, error)                            { return "", nil }
func (*Client) Do(req *http.Request) (*http.Response, error)       { return nil, nil }
