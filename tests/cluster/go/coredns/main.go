// CoreDNS for the test cluster with only the plugins its Corefile uses (tests/cluster/up):
// CoreDNS's own main links every plugin (cloud DNS providers, etcd, grpc, ...), which is most
// of its build time and none of which the test cluster needs. Plugins register themselves in
// their init functions; the directive order stays CoreDNS's own (core/dnsserver).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
