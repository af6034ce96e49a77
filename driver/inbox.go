package driver

// InboxExecutor is the storage of the consumer inbox (table processed_event).
// Its methods are added by the inbox work; see package inbox.
type InboxExecutor interface{}
