"""A real Kubernetes control plane on one machine, and the project's kubelet for its nodes.

`make cluster` runs `python -m localcluster up` (with tools/cluster on the path): the upstream
control plane built from its Go modules (tools/cluster/controlplane: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, unmodified), then one kubelet process per Node
(kubelet.py), then the operator with the chart. Everything it makes lives under `.cluster/` of the
checkout, in network namespaces named `dtrain-c-*` and on the bridge `dtrain0`; `down` removes it.
"""
