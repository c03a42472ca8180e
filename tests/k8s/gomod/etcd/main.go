// Command etcd is the upstream etcd server, built from its published Go module
// so that the test harness needs no release tarball or container image.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
