package saga

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CompensationPrefix starts the name of every compensation step: the
// compensation of step "reserve-stock" is the step
// "compensate:reserve-stock" of the same saga. Forward step names must not
// start with it.
const CompensationPrefix = "compensate:"

// MaxNameLen is the longest saga ID, saga type or step name, in bytes.
const MaxNameLen = 200

// CompensationName returns the name of the compensation step of step.
func CompensationName(step string) string { return CompensationPrefix + step }

func checkName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the %s is empty", ErrInvalidName, what)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: the %s is %d bytes long; at most %d", ErrInvalidName, what, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: the %s %q is not valid UTF-8", ErrInvalidName, what, name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%w: the %s %q contains a control character", ErrInvalidName, what, name)
	}
	return nil
}

// checkStep validates a saga ID and a forward step name.
func checkStep(sagaID, step string) error {
	if err := checkName("saga ID", sagaID); err != nil {
		return err
	}
	if err := checkName("step name", step); err != nil {
		return err
	}
	if strings.HasPrefix(step, CompensationPrefix) {
		return fmt.Errorf("%w: the step name %q starts with %q, which is reserved for compensations", ErrInvalidName, step, CompensationPrefix)
	}
	return nil
}
