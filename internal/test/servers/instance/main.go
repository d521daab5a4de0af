// Command instance is one sluice client process of a distributed test run,
// started by servers.StartInstances; it is not meant to be run by hand. It
// is all harness.InstanceMain, which says what it reads and writes.
package main

import "github.com/sluicehq/sluice/internal/test/harness"

func main() { harness.InstanceMain(harness.Connect) }
