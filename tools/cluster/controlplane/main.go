// Command controlplane is the upstream Kubernetes control plane in one binary: its first
// argument picks the role, and each role runs as its own process (as envtest and k3s start
// them). Every role is the upstream command itself, unmodified: etcd's etcdmain and the
// cobra commands of kube-apiserver, kube-controller-manager and kube-scheduler.
//
//	controlplane etcd --data-dir ...
//	controlplane kube-apiserver --etcd-servers ...
//	controlplane kube-controller-manager --kubeconfig ...
//	controlplane kube-scheduler --kubeconfig ...
package main

import (
	"fmt"
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream's kube-apiserver and controller-manager import

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var roles = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: controlplane etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags]")
		os.Exit(2)
	}
	role, args := os.Args[1], os.Args[2:]
	if role == "etcd" {
		// etcdmain reads os.Args[0] as the program name and parses the rest.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	}
	newCommand, known := roles[role]
	if !known {
		fmt.Fprintf(os.Stderr, "controlplane: unknown role %q (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)\n", role)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
