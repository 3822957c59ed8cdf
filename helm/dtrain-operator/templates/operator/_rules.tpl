{{/*
The operator's RBAC rules, least privilege: every verb is one that kopf or the operator's code
(operator/dtrain_operator/kube.py, called from controller.py) uses, and
tests/operator/test_rbac_matches_calls.py compares them with the calls of a recorded run.

Nothing here is cluster-scoped (the TokenReview of the report endpoint is, in rbac.yaml): the operator runs kopf standalone (no peering objects) and with
scanning disabled (main.py), so kopf neither watches CRDs nor lists namespaces; it finds the
served resources once through discovery, which every authenticated client may read.
*/}}
{{- define "dtrain-operator.rules" -}}
# kopf and the operator: Events on DistributedTrainings (kopf's warnings, dtrain's phase changes).
# A warning that repeats counts up the Event posted first (its count and last-seen time).
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# kopf: the watch of DistributedTrainings. The operator: deletes a finished job after
# runPolicy.ttlSecondsAfterFinished.
- apiGroups: [dtrain.dev]
  resources: [distributedtrainings]
  verbs: [list, watch, delete]
# The operator: its record of each job, which it alone writes (what it accepted, phase, conditions,
# node counts, restarts, artifacts).
- apiGroups: [dtrain.dev]
  resources: [distributedtrainings/status]
  verbs: [patch]
# Worker pods. kopf: watched (an index of each job's pods). The operator: created per gang
# generation, read back when a create meets 409, deleted for a gang restart, suspend, cleanPodPolicy;
# patched for a restart in place (their gang-generation label, nothing else).
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, watch, patch, delete]
# The engine Job: like the pods (deleted when a job is suspended or cleaned up).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, delete]
# The headless Service (rank 0's DNS name): created, read back on 409; kopf: watched (an index of whose each job's
# Service is, so that a restarted gang needs no read). It goes with the job through its owner reference (garbage
# collection), never by the operator. The trainer's config goes in each pod's annotations.
- apiGroups: [""]
  resources: [services]
  verbs: [create, get, list, watch]
# The PodGroup for gang scheduling (Kubernetes' own, Volcano or scheduler-plugins): created, read back on 409.
- apiGroups: [scheduling.k8s.io, scheduling.volcano.sh, scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [create, get]
# Kueue: the Workload of a queued job's gang and its LocalQueue, read (never written) to say where it waits and why.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads, localqueues]
  verbs: [get]
{{- if .Values.networkPolicy.enabled }}
# networkPolicy.enabled: a NetworkPolicy per job (ingress only from its own pods): created, read back on 409.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get]
{{- end }}
{{- if .Values.rbac.ownerReferencesPermissionEnforcement }}
# Children carry blockOwnerDeletion in their owner reference; with the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) that needs this.
- apiGroups: [dtrain.dev]
  resources: [distributedtrainings/finalizers]
  verbs: [update]
{{- end }}
{{- end }}
