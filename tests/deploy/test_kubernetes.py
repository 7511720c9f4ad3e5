"""deploy/kubernetes: the manifests against the Kubernetes schemas, and wired together right.

Built-in kinds are validated strictly (unknown fields refused) against the Kubernetes JSON
schemas that the `kubernetes-validate` package ships (offline). KubeRay's RayCluster: each pod
template against Kubernetes' PodTemplateSpec schema, its rayStartParams as the strings KubeRay
requires; the whole object against KubeRay's own CRD schema (ray-operator/config/crd/bases/
ray.io_rayclusters.yaml of a KubeRay release, kept with its licence in
../shared/vendor/kuberay/, or the file $KUBERAY_CRD names, e.g. `kubectl get crd
rayclusters.ray.io -o yaml` on a cluster with KubeRay); that test skips, saying where it
looked, only where neither is there. The sites' and the coordinator's configurations are
read by the project's own config loaders.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
from kubernetes_validate import utils as kv  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("PATHMASTER_SHARED", REPO.parent / "shared"))
K8S = REPO / "deploy" / "kubernetes"
SITES = ("connecticut", "new-york", "california")
GRPC_PORTS = {50051, 50061, 50062, 50063, 50064}


def _docs(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _site(name: str) -> list[dict]:
    return _docs((K8S / "site.template.yaml").read_text().replace("__SITE__", name))


def _all() -> list[dict]:
    docs = _docs((K8S / "namespace.yaml").read_text()) + _docs((K8S / "coordinator.yaml").read_text())
    for name in SITES:
        docs += _site(name)
    return docs


def _kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def _validate_against(schema_file: str, data: dict) -> None:
    """Validate `data` strictly against one schema of kubernetes-validate's newest version."""
    import jsonschema
    from referencing import Registry, Resource

    folder = f"kubernetes-json-schema/v{_version()}-local-strict"
    schema = kv.schema_contents(f"{folder}/{schema_file}", _version())
    definitions = kv.schema_contents(f"{folder}/_definitions.json", _version())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(data)


def _version() -> str:
    return max(kv.all_versions(), key=lambda v: tuple(int(x) for x in v.split(".")))


def _pod_templates(cluster: dict) -> list[dict]:
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


@pytest.mark.parametrize("doc", [d for d in _all() if d["apiVersion"] != "ray.io/v1"],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_builtin_kinds_match_the_kubernetes_schema(doc):
    kubernetes_validate.validate(doc, _version(), strict=True)   # raises naming the field


@pytest.mark.parametrize("name", SITES)
def test_raycluster_pod_templates_match_the_kubernetes_schema(name):
    (cluster,) = _kind(_site(name), "RayCluster")
    for template in _pod_templates(cluster):
        _validate_against("podtemplatespec-v1.json", template)
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for group in groups:   # KubeRay v1: map[string]string, `ray start` flags without dashes
        assert all(isinstance(v, str) and not k.startswith("-") for k, v in group["rayStartParams"].items())


def _kuberay_crd() -> Path:
    """KubeRay's RayCluster CRD: $KUBERAY_CRD, else the vendored copy in ../shared; skips where absent."""
    path = Path(os.environ.get("KUBERAY_CRD") or SHARED / "vendor" / "kuberay" / "ray.io_rayclusters.yaml")
    if not path.is_file():
        pytest.skip(f"KubeRay's CRD schema not found at {path} (set PATHMASTER_SHARED, or KUBERAY_CRD "
                    "to a copy of ray.io_rayclusters.yaml)")
    return path


def _strict(schema):
    """`schema` refusing unknown fields where it lists an object's fields, as `kubectl apply`'s
    default strict field validation does (the API server would otherwise drop them silently)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def _crd_validator():
    import jsonschema

    crd = yaml.safe_load(_kuberay_crd().read_text())
    assert crd["spec"]["names"]["kind"] == "RayCluster"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


@pytest.mark.parametrize("name", SITES)
def test_raycluster_matches_kuberays_crd_schema(name):
    (cluster,) = _kind(_site(name), "RayCluster")
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _crd_validator().iter_errors(cluster)]
    assert not errors, errors


def test_kuberays_crd_schema_refuses_what_kuberay_refuses():
    """The schema really checks: a wrongly typed rayStartParams value, a missing head group and
    a misspelt field fail."""
    validator = _crd_validator()
    (cluster,) = _kind(_site(SITES[0]), "RayCluster")
    wrong = json.loads(json.dumps(cluster))
    wrong["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 1       # KubeRay wants strings
    assert any(e.validator == "type" for e in validator.iter_errors(wrong))
    headless = json.loads(json.dumps(cluster))
    del headless["spec"]["headGroupSpec"]
    assert any(e.validator == "required" for e in validator.iter_errors(headless))
    misspelt = json.loads(json.dumps(cluster))
    misspelt["spec"]["workerGroupSpecs"][0]["replica"] = 1                  # for `replicas`
    assert any(e.validator == "additionalProperties" for e in validator.iter_errors(misspelt))


@pytest.mark.parametrize("name", SITES)
def test_site_is_wired_to_its_data(name, tmp_path):
    from services.config import load_site_config

    docs = _site(name)
    (config_map,) = _kind(docs, "ConfigMap")
    (toml_file := tmp_path / "site.toml").write_text(config_map["data"]["site.toml"])
    config = load_site_config(toml_file)                  # the project's own check of the file
    assert config.name == name and config.tls is not None and config.tls.mutual
    (cluster,) = _kind(docs, "RayCluster")
    (pvc,) = _kind(docs, "PersistentVolumeClaim")
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    # the only group offering the site's resource is the one that mounts its database
    offered = json.loads(json.loads(workers["rayStartParams"]["resources"]))
    assert offered == {config.ray_resource: 1}
    assert "resources" not in cluster["spec"]["headGroupSpec"]["rayStartParams"]
    volumes = {v["name"]: v for v in workers["template"]["spec"]["volumes"]}
    (mount,) = [m for c in workers["template"]["spec"]["containers"] for m in c["volumeMounts"]
                if volumes[m["name"]].get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
    assert Path(mount["mountPath"]) == config.db
    # the Service reaches the pod that runs the site server, on the ports it listens on
    (service,) = _kind(docs, "Service")
    head = cluster["spec"]["headGroupSpec"]["template"]
    assert service["spec"]["selector"].items() <= head["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= workers["template"]["metadata"]["labels"].items()
    assert {p["port"] for p in service["spec"]["ports"]} == {int(config.listen.rsplit(":", 1)[1]),
                                                              *config.class_ports.values()}


def test_only_the_coordinator_reaches_the_sites():
    docs = _all()
    (deployment,) = _kind(docs, "Deployment")
    coordinator_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for name in SITES:
        site_docs = _site(name)
        (policy,) = _kind(site_docs, "NetworkPolicy")
        (cluster,) = _kind(site_docs, "RayCluster")
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for template in _pod_templates(cluster):   # every site pod is covered by the policy
            assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        grpc_rules = [rule for rule in policy["spec"]["ingress"] if "ports" in rule]
        (rule,) = grpc_rules
        (peer,) = rule["from"]
        assert peer["podSelector"]["matchLabels"].items() <= coordinator_labels.items()
        assert {p["port"] for p in rule["ports"]} == GRPC_PORTS
        for other in (r for r in policy["spec"]["ingress"] if "ports" not in r):   # Ray among its own pods
            for peer in other["from"]:
                assert peer["podSelector"]["matchLabels"] == {"pathmaster/site": name}
                assert not peer["podSelector"]["matchLabels"].items() <= coordinator_labels.items()


def test_coordinator_config_names_the_site_services(tmp_path):
    from services.config import load_coordinator_config

    docs = _all()
    config_map = next(d for d in _kind(docs, "ConfigMap") if d["metadata"]["name"] == "coordinator")
    (toml_file := tmp_path / "coordinator.toml").write_text(config_map["data"]["coordinator.toml"])
    config = load_coordinator_config(toml_file)
    services = {d["metadata"]["name"] for d in _kind(docs, "Service")}
    assert {site.address for site in config.sites} == {f"site-{n}.pathmaster.svc:50051" for n in SITES}
    assert {site.address.split(".")[0] for site in config.sites} <= services
    (deployment,) = _kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["exec"]["command"][:3] == ["pathmaster", "health", "coordinator"]
