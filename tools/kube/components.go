package main

// The node components a k3s server runs beside the API server, each the
// upstream command exactly as its own main package builds it: `corral dev up
// --node` runs them as `corral-kube kubelet ...`, `corral-kube scheduler ...`
// and so on. One binary keeps one cached build and one version for the whole
// plane, as k3s does with its single executable.

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/restclient"
	_ "k8s.io/component-base/metrics/prometheus/version"
	_ "k8s.io/component-base/metrics/prometheus/workqueue"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

// components maps a first argument to the upstream command it runs.
var components = map[string]func() *cobra.Command{
	"kubelet":            func() *cobra.Command { return kubeletapp.NewKubeletCommand(context.Background()) },
	"scheduler":          func() *cobra.Command { return schedapp.NewSchedulerCommand() },
	"controller-manager": func() *cobra.Command { return cmapp.NewControllerManagerCommand() },
	"proxy":              func() *cobra.Command { return proxyapp.NewProxyCommand() },
}

// runComponent runs the named component with the remaining arguments and
// returns its exit code; ok is false when name is not a component.
func runComponent(name string, args []string) (code int, ok bool) {
	build, ok := components[name]
	if !ok {
		return 0, false
	}
	command := build()
	command.SetArgs(args)
	return cli.Run(command), true
}
