// Command nonewprivs is the CRI conformance suite's no_new_privs probe. Its
// image installs it setuid root; started as uid 1000 it prints its
// effective uid: 0 when the exec granted the setuid bit, 1000 when
// no_new_privs kept it from doing so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
