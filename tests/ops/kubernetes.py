"""Checks of deploy/kubernetes that a schema cannot make, run by tests/ops.rs.

Usage: kubernetes.py NAMESPACE DAEMONSET POD DAEMONSET_FD_ONLY POD_FD_ONLY
                     [DAEMONSET_DEVICE_PLUGIN POD_DEVICE_PLUGIN NAMESPACE_INFERENCE]

Prints one "FAIL ..." line per failed check, then "checked".

pss_level() is a subset of the Pod Security Standards: the controls these
manifests touch (host namespaces, hostPath and other volume types,
privileged, capabilities, host ports, seccomp, privilege escalation,
non-root). It is not the admission controller; it is here so that what the
manifests and docs/operations.md say about the level each deployment needs is held
to the fields.
"""

import copy
import os
import sys

import yaml

LEVELS = ["privileged", "baseline", "restricted"]
# Baseline: the capabilities a container may add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
# Restricted: the volume types a pod may use.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def pss_level(spec):
    """The strictest Pod Security level a pod spec meets (see the module doc)."""
    pod_context = spec.get("securityContext", {})
    containers = spec.get("initContainers", []) + spec["containers"]

    def setting(container, key):
        return container.get("securityContext", {}).get(key, pod_context.get(key))

    def capabilities(container):
        return container.get("securityContext", {}).get("capabilities", {})

    volumes = spec.get("volumes", [])
    baseline = (
        not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        and not any("hostPath" in v for v in volumes)
        and not any(setting(c, "privileged") for c in containers)
        and all(set(capabilities(c).get("add", [])) <= BASELINE_CAPABILITIES for c in containers)
        and not any(p.get("hostPort") for c in containers for p in c.get("ports", []))
        and all((setting(c, "seccompProfile") or {}).get("type") != "Unconfined" for c in containers)
    )
    if not baseline:
        return "privileged"
    restricted = (
        all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in volumes)
        and all(c.get("securityContext", {}).get("allowPrivilegeEscalation") is False for c in containers)
        and all(setting(c, "runAsNonRoot") is True for c in containers)
        and all(setting(c, "runAsUser") != 0 for c in containers)
        and all((setting(c, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost") for c in containers)
        and all("ALL" in capabilities(c).get("drop", []) for c in containers)
        and all(set(capabilities(c).get("add", [])) <= {"NET_BIND_SERVICE"} for c in containers)
    )
    return "restricted" if restricted else "baseline"


def without_host_path(spec):
    spec = copy.deepcopy(spec)
    spec["volumes"] = [v for v in spec.get("volumes", []) if "hostPath" not in v]
    return spec


def socket_dir_mount(spec, container):
    """Where `container` mounts the node's /run/ptxd, or None."""
    names = {v["name"] for v in spec.get("volumes", []) if v.get("hostPath", {}).get("path") == "/run/ptxd"}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in names:
            return mount["mountPath"]
    return None


def check_daemonset(ds, name):
    spec = ds["spec"]["template"]["spec"]
    meta = ds["spec"]["template"]["metadata"]
    c = spec["containers"][0]
    check(ds["kind"] == "DaemonSet", name + " is a DaemonSet")
    args = c["args"]
    socket = args[args.index("--socket") + 1] if "--socket" in args else None
    # ptxd binds ptxd.sock and ptxd.sock.fds in the socket's directory: it
    # must be the node's directory, the one the clients mount.
    check(socket is not None and os.path.dirname(socket) == socket_dir_mount(spec, c),
          name + ": --socket lies in the mounted node /run/ptxd")
    owners = [i for i in spec.get("initContainers", [])
              if i.get("command") == ["chown", "65532:65532", "/run/ptxd"]
              and socket_dir_mount(spec, i) == "/run/ptxd"]
    check(len(owners) == 1, name + ": an init container hands /run/ptxd to uid 65532")
    for i in owners:
        caps = i.get("securityContext", {}).get("capabilities", {})
        check(caps.get("drop") == ["ALL"] and caps.get("add") == ["CHOWN"], name + ": the chown init container has CHOWN only")
    check("nvidia.com/gpu" in [t.get("key") for t in spec.get("tolerations", [])], name + " GPU toleration")
    check(bool(spec.get("nodeSelector")), name + " nodeSelector")
    resources = c.get("resources", {})
    check("nvidia.com/gpu" not in resources.get("requests", {}) and "nvidia.com/gpu" not in resources.get("limits", {}),
          name + ": ptxd claims no GPU")
    check({"cpu", "memory"} <= set(resources.get("requests", {})), name + " resource requests")
    for probe in ("livenessProbe", "readinessProbe"):
        check(probe in c, name + " " + probe)
    ann = meta.get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true", name + " scrape annotation")
    port = ann.get("prometheus.io/port")
    check(port is not None and any(str(p["containerPort"]) == port for p in c["ports"]),
          name + ": the annotated port is a container port")
    check(("0.0.0.0:" + str(port)) in args and "--metrics-allow-remote" in args,
          name + ": metrics on the annotated port, allowed remote")
    check(spec["securityContext"].get("runAsUser") == 65532, name + ": ptxd runs as 65532")
    return spec


def check_client(pod, name):
    spec = pod["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    socket = env.get("PTXD_SOCKET")
    # The SDK finds the fd socket beside the gRPC socket it dials.
    check(socket is not None and os.path.dirname(socket) == socket_dir_mount(spec, c),
          name + ": PTXD_SOCKET lies in the mounted node /run/ptxd")
    check(65532 in spec["securityContext"].get("supplementalGroups", []), name + " in ptxd's group")
    check("nvidia.com/gpu" in [t.get("key") for t in spec.get("tolerations", [])], name + " GPU toleration")
    check(bool(spec.get("nodeSelector")), name + " nodeSelector")
    return spec


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


namespace, ds, pod, ds_fd, pod_fd = (load(p) for p in sys.argv[1:6])

shared = [(check_daemonset(ds, "daemonset.yaml"), "daemonset.yaml"),
          (check_client(pod, "example-inference-pod.yaml"), "example-inference-pod.yaml")]
fd_only = [(check_daemonset(ds_fd, "daemonset-fd-only.yaml"), "daemonset-fd-only.yaml"),
           (check_client(pod_fd, "example-inference-pod-fd-only.yaml"), "example-inference-pod-fd-only.yaml")]

# Legacy CUDA IPC handles need one PID namespace, IPC events and shm names
# one /dev/shm: the shared deployment keeps both, on ptxd and its clients.
for spec, name in shared:
    check(spec.get("hostPID") is True, name + " hostPID")
    check(spec.get("hostIPC") is True, name + " hostIPC")
# Buffers by fd cross namespaces: the fd-only deployment shares none.
for spec, name in fd_only:
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        check(not spec.get(key), name + " has no " + key)

# The variants differ in the host namespaces alone (and the client's name).
def drop_namespaces(document):
    document = copy.deepcopy(document)
    spec = document["spec"]["template"]["spec"] if document["kind"] == "DaemonSet" else document["spec"]
    spec.pop("hostPID", None)
    spec.pop("hostIPC", None)
    return document
check(drop_namespaces(ds) == ds_fd, "daemonset-fd-only.yaml is daemonset.yaml less hostPID/hostIPC")
check(drop_namespaces(pod)["spec"] == pod_fd["spec"],
      "example-inference-pod-fd-only.yaml's spec is example-inference-pod.yaml's less hostPID/hostIPC")
check(ds["metadata"] == ds_fd["metadata"], "both DaemonSets are the one ptxd/ptxd (alternatives)")

# Pod Security: every one needs privileged (hostPath); without the hostPath
# the fd-only client would be restricted, the fd-only DaemonSet baseline (its
# chown init container runs as root with CHOWN).
for spec, name in shared + fd_only:
    check(pss_level(spec) == "privileged", name + " needs privileged")
check(pss_level(without_host_path(fd_only[0][0])) == "baseline",
      "daemonset-fd-only.yaml: the hostPath alone keeps it from baseline")
check(pss_level(without_host_path(fd_only[1][0])) == "restricted",
      "example-inference-pod-fd-only.yaml: the hostPath alone keeps it from restricted")
check(pss_level(without_host_path(shared[1][0])) == "privileged",
      "example-inference-pod.yaml needs privileged for hostPID/hostIPC too")
# The namespace allows what its pods need and nothing looser.
labels = namespace["metadata"].get("labels", {})
needed = min((pss_level(spec) for spec, _ in shared + fd_only), key=LEVELS.index)
check(labels.get("pod-security.kubernetes.io/enforce") == needed,
      "namespace.yaml enforces " + needed)
for document in (ds, pod, ds_fd, pod_fd):
    check(document["metadata"]["namespace"] == namespace["metadata"]["name"],
          document["metadata"]["name"] + " is in namespace " + namespace["metadata"]["name"])


def arg_value(args, flag, default):
    return args[args.index(flag) + 1] if flag in args else default


def check_device_plugin(ds_dp, pod_dp, ns_inference):
    """The device-plugin variant: daemonset-fd-only.yaml plus the plugin's
    container and the kubelet's device-plugin directory; its client pod is
    `restricted`, requests the plugin's resource and mounts nothing."""
    name = "daemonset-device-plugin.yaml"
    spec = check_daemonset(ds_dp, name)
    plugins = [c for c in spec["containers"] if c.get("args", [])[:1] == ["device-plugin"]]
    check(len(plugins) == 1, name + ": one device-plugin container")
    if len(plugins) != 1:
        return
    plugin = plugins[0]
    ptxd_args = spec["containers"][0]["args"]
    args = plugin["args"]
    # What the plugin checks and what it hands to pods is ptxd's socket.
    check(arg_value(args, "--socket", "/run/ptxd/ptxd.sock") == ptxd_args[ptxd_args.index("--socket") + 1],
          name + ": the plugin watches ptxd's socket")
    check(socket_dir_mount(spec, plugin) == os.path.dirname(arg_value(args, "--socket", "/run/ptxd/ptxd.sock")),
          name + ": the plugin reaches that socket in the mounted node /run/ptxd")
    check(arg_value(args, "--host-socket-dir", "/run/ptxd") == "/run/ptxd",
          name + ": Allocate mounts the node's /run/ptxd")
    plugin_dirs = {v["name"] for v in spec["volumes"]
                   if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/device-plugins"}
    mounted = [m["mountPath"] for m in plugin.get("volumeMounts", []) if m["name"] in plugin_dirs]
    check(mounted == [arg_value(args, "--plugin-dir", "/var/lib/kubelet/device-plugins")],
          name + ": --plugin-dir is the mounted kubelet device-plugin directory")
    # Apart from the plugin, it is the fd-only DaemonSet.
    document = copy.deepcopy(ds_dp)
    template = document["spec"]["template"]["spec"]
    template["containers"] = [c for c in template["containers"] if c is not plugin and c["name"] != plugin["name"]]
    template["volumes"] = [v for v in template["volumes"] if v["name"] not in plugin_dirs]
    check(document == ds_fd, name + " is daemonset-fd-only.yaml plus the device plugin")
    check(pss_level(spec) == "privileged", name + " needs privileged (hostPath)")

    name = "example-inference-pod-device-plugin.yaml"
    pod_spec = pod_dp["spec"]
    resource = arg_value(args, "--resource", "ptxd.dev/session")
    for c in pod_spec["containers"]:
        limits = c.get("resources", {}).get("limits", {})
        check(str(limits.get(resource)) == "1", name + ": requests one " + resource)
        env = {e["name"] for e in c.get("env", [])}
        check("PTXD_SOCKET" not in env, name + ": PTXD_SOCKET comes from Allocate, not the spec")
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        check(not pod_spec.get(key), name + " has no " + key)
    check(not any("hostPath" in v for v in pod_spec.get("volumes", [])), name + " has no hostPath")
    check(65532 in pod_spec["securityContext"].get("supplementalGroups", []), name + " in ptxd's group")
    level = pss_level(pod_spec)
    check(level == "restricted", name + " meets restricted (it meets " + level + ")")
    labels = ns_inference["metadata"].get("labels", {})
    check(labels.get("pod-security.kubernetes.io/enforce") == "restricted",
          "namespace-inference.yaml enforces restricted")
    check(pod_dp["metadata"]["namespace"] == ns_inference["metadata"]["name"],
          name + " is in namespace " + ns_inference["metadata"]["name"])
    check(ds_dp["metadata"] == ds_fd["metadata"], "the device-plugin DaemonSet is ptxd/ptxd too (an alternative)")


if len(sys.argv) > 6:
    check_device_plugin(*(load(p) for p in sys.argv[6:9]))

for failure in failures:
    print("FAIL " + failure)
print("checked")
