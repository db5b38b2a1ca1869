"""deploy/k8s/ checked as far as a machine without Kubernetes allows: every FlinkDeployment, FlinkSessionJob and
FlinkStateSnapshot against the Flink Kubernetes Operator's CRD schema made strict (an unknown field anywhere is
an error, as with the API server's strict field validation; other clients get it dropped with a warning), and
the jobs' arguments against the jobs' own parsers.

The CRDs come from ``org.apache.flink:flink-kubernetes-operator-api:1.10.0`` (Maven Central, SHA-256-locked,
fetched once into the jar cache). That operator's ``flinkVersion`` enum ends at ``v1_20``; Flink 2.3 needs
operator 1.15.0, so that one field is checked against 1.15.0's list below and relaxed in the 1.10.0 schema.
``flinkConfiguration`` is a map of strings to every CRD: its keys and values are Flink's, checked by nothing
here but the few cross-checks at the end.
"""

from __future__ import annotations

import copy
import importlib
import re
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from flink_agents_replay.flink.config import SIGNING_KEY_ENV, AgentConfig
from flink_agents_replay.local.jars import fetch_jars

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
PINNED_FLINK = re.search(r'"apache-flink==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)

OPERATOR_API_BUNDLE = "flink-kubernetes-operator-api"
OPERATOR_API_JAR = "flink-kubernetes-operator-api-1.10.0.jar"
API_VERSION = "flink.apache.org/v1beta1"
CRD_FILES = {
    "FlinkDeployment": "META-INF/fabric8/flinkdeployments.flink.apache.org-v1.yml",
    "FlinkSessionJob": "META-INF/fabric8/flinksessionjobs.flink.apache.org-v1.yml",
    "FlinkStateSnapshot": "META-INF/fabric8/flinkstatesnapshots.flink.apache.org-v1.yml",
}

#: ``FlinkVersion`` of operator 1.15.0, the first release that knows Flink 2.3 (1.13.0 and 1.14.0 end at v2_2,
#: 1.10.0 at v1_20): flink-kubernetes-operator-api/src/main/java/org/apache/flink/kubernetes/operator/api/spec/
#: FlinkVersion.java at tag release-1.15.0 of github.com/apache/flink-kubernetes-operator.
OPERATOR_1_15_FLINK_VERSIONS = ("v1_13", "v1_14", "v1_15", "v1_16", "v1_17", "v1_18", "v1_19", "v1_20",
                                "v2_0", "v2_1", "v2_2", "v2_3", "v2_4")
#: The operator's own rule for a FlinkDeployment's name (DefaultValidator.DEPLOYMENT_NAME_PATTERN, 1.15.0) and
#: the settings it refuses in flinkConfiguration (DefaultValidator.FORBIDDEN_CONF_KEYS): the operator sets them.
DEPLOYMENT_NAME = re.compile(r"[a-z]([-a-z\d]{0,43}[a-z\d])?")
FORBIDDEN_CONF_KEYS = ("kubernetes.namespace", "kubernetes.cluster-id", "high-availability.cluster-id")

PYTHON_DRIVER = "org.apache.flink.client.python.PythonDriver"
AGENT_JOB = "flink_agents_replay.jobs.agent_job"
REPLAY_JOB = "flink_agents_replay.jobs.replay_job"

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# --- the strict schema ------------------------------------------------------------------------------------------

def strict(schema: Any) -> Any:
    """A copy of an OpenAPI v3 (Kubernetes structural) schema as a JSON Schema that refuses unknown fields.

    Every schema that lists ``properties`` gets ``additionalProperties: false`` (at every depth, inside
    ``items``, ``additionalProperties`` and ``*Of`` too), unless it says ``x-kubernetes-preserve-unknown-fields``;
    ``x-kubernetes-int-or-string`` takes an integer or a string.
    """
    if not isinstance(schema, dict):
        return schema
    if schema.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    result = dict(schema)
    if "properties" in result:
        result["properties"] = {name: strict(sub) for name, sub in result["properties"].items()}
        if "additionalProperties" not in result and not result.get("x-kubernetes-preserve-unknown-fields"):
            result["additionalProperties"] = False
    for keyword in ("items", "additionalProperties", "not"):
        if isinstance(result.get(keyword), dict):
            result[keyword] = strict(result[keyword])
    for keyword in ("anyOf", "allOf", "oneOf"):
        if keyword in result:
            result[keyword] = [strict(sub) for sub in result[keyword]]
    if result.get("nullable") and isinstance(result.get("type"), str):
        result["type"] = [result["type"], "null"]
    return result


def crd_schema(jar: Path, kind: str) -> dict:
    """The v1beta1 ``openAPIV3Schema`` of ``kind``'s CRD inside the operator's API jar."""
    with zipfile.ZipFile(jar) as archive:
        crd = yaml.load(archive.read(CRD_FILES[kind]), Loader=_LOADER)
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return version["schema"]["openAPIV3Schema"]


def document_schema(kind: str, openapi: dict) -> dict:
    """The strict schema of a whole ``kind`` document: the CRD's, with apiVersion, kind and metadata (which the
    API server checks itself) and with flinkVersion's enum relaxed (checked against operator 1.15.0 apart)."""
    schema = strict(copy.deepcopy(openapi))
    spec = schema["properties"]["spec"]["properties"]
    if "flinkVersion" in spec:
        spec["flinkVersion"].pop("enum")
    schema["properties"].update({
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": kind},
        "metadata": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {
                "name": {"type": "string"}, "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    })
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


@pytest.fixture(scope="module")
def operator_api_jar() -> Path:
    jar = fetch_jars(OPERATOR_API_BUNDLE) / OPERATOR_API_JAR
    assert jar.is_file(), f"the {OPERATOR_API_BUNDLE} bundle holds no {OPERATOR_API_JAR}"
    return jar


@pytest.fixture(scope="module")
def validators(operator_api_jar) -> dict[str, jsonschema.Draft202012Validator]:
    result = {}
    for kind in CRD_FILES:
        # (Not check_schema: 2 s for what the API server checked when the CRD was installed.)
        result[kind] = jsonschema.Draft202012Validator(document_schema(kind, crd_schema(operator_api_jar, kind)))
    return result


def where(error: jsonschema.ValidationError) -> str:
    """The error's place in the document, as ``spec.podTemplate.spec.containers[0]``."""
    text = ""
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def errors_of(validator, document) -> list[jsonschema.ValidationError]:
    return sorted(validator.iter_errors(document), key=lambda error: where(error))


# --- the manifests --------------------------------------------------------------------------------------------

def _documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document is not None:
                found.append((f"{path.name}#{index}", document))
    return found


DOCUMENTS = _documents()
FLINK_DOCUMENTS = [(name, doc) for name, doc in DOCUMENTS if doc.get("kind") in CRD_FILES]
SECRETS = [doc for _, doc in DOCUMENTS if doc.get("kind") == "Secret"]
SNAPSHOTS = [doc for _, doc in FLINK_DOCUMENTS if doc["kind"] == "FlinkStateSnapshot"]
DEPLOYMENTS = {doc["metadata"]["name"]: doc for _, doc in FLINK_DOCUMENTS if doc["kind"] == "FlinkDeployment"}


def _job_module(doc: dict) -> str:
    return doc["spec"]["job"]["args"][1]


(PRODUCTION,) = [doc for doc in DEPLOYMENTS.values() if _job_module(doc) == AGENT_JOB]
(REPLAY,) = [doc for doc in DEPLOYMENTS.values() if _job_module(doc) == REPLAY_JOB]


def _tokens(path: str) -> list[str | int]:
    return [int(token[1:-1]) if token.startswith("[") else token for token in re.findall(r"\[\d+\]|[^.\[\]]+", path)]


def _at(document: Any, path: str) -> Any:
    for token in _tokens(path):
        document = document[token]
    return document


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_manifests_are_flink_resources_and_their_secret():
    assert {doc["kind"] for _, doc in DOCUMENTS} <= {*CRD_FILES, "Secret"}
    assert (len(DEPLOYMENTS), len(SNAPSHOTS), len(SECRETS)) == (2, 1, 1)
    assert all(doc["apiVersion"] == API_VERSION for _, doc in FLINK_DOCUMENTS)


@pytest.mark.parametrize(("name", "document"), FLINK_DOCUMENTS, ids=[name for name, _ in FLINK_DOCUMENTS])
def test_manifest_passes_the_strict_crd_schema(validators, name, document):
    errors = errors_of(validators[document["kind"]], document)
    assert not errors, "\n".join(f"{name}: {where(error)}: {error.message}" for error in errors)


# Per kind, misspelt fields (the misspelling's parent, the field, its misspelling) and wrong types (the field, a
# value of another type, the type the schema wants), each at depth 3 or more; every manifest gets all of its kind's.
MISSPELT = {
    "FlinkDeployment": [
        ("spec.job", "upgradeMode", "upgradeModee"),
        ("spec.jobManager.resource", "memory", "memmory"),
        ("spec.podTemplate.spec.containers[0]", "env", "envv"),
        ("spec.podTemplate.spec.containers[0].env[0].valueFrom", "secretKeyRef", "secretKeyReff"),
    ],
    "FlinkStateSnapshot": [
        ("spec.savepoint", "disposeOnDelete", "disposeOnDeletee"),
        ("spec.jobReference", "name", "nmae"),
    ],
}
WRONG_TYPE = {
    "FlinkDeployment": [
        ("spec.job.parallelism", "two", "integer"),
        ("spec.job.args[0]", 7, "string"),
        ("spec.taskManager.resource.cpu", "two", "number"),
        ("spec.podTemplate.spec.containers[0].env[0].valueFrom.secretKeyRef.optional", "yes", "boolean"),
    ],
    "FlinkStateSnapshot": [
        ("spec.savepoint.disposeOnDelete", "no", "boolean"),
        ("spec.jobReference.name", 5, "string"),
    ],
}
MISSPELT_CASES = [(name, doc, *case) for name, doc in FLINK_DOCUMENTS for case in MISSPELT[doc["kind"]]]
WRONG_TYPE_CASES = [(name, doc, *case) for name, doc in FLINK_DOCUMENTS for case in WRONG_TYPE[doc["kind"]]]


@pytest.mark.parametrize(("name", "document", "parent", "field", "misspelt"), MISSPELT_CASES,
                         ids=[f"{case[0]}-{case[4]}" for case in MISSPELT_CASES])
def test_misspelt_field_deep_down_is_refused_with_its_path(validators, name, document, parent, field, misspelt):
    broken = copy.deepcopy(document)
    holder = _at(broken, parent)
    holder[misspelt] = holder.pop(field)
    (error,) = errors_of(validators[document["kind"]], broken)
    assert (where(error), error.validator) == (parent, "additionalProperties")
    assert f"'{misspelt}' was unexpected" in error.message


@pytest.mark.parametrize(("name", "document", "path", "value", "wanted"), WRONG_TYPE_CASES,
                         ids=[f"{case[0]}-{case[2]}" for case in WRONG_TYPE_CASES])
def test_wrong_type_deep_down_is_refused_with_its_path(validators, name, document, path, value, wanted):
    broken = copy.deepcopy(document)
    *parent, leaf = _tokens(path)
    holder = broken
    for token in parent:
        holder = holder[token]
    holder[leaf] = value
    (error,) = errors_of(validators[document["kind"]], broken)
    assert (where(error), error.validator, error.validator_value) == (path, "type", wanted)


def test_every_manifest_has_negative_cases_at_depth_three_or_more():
    for name, document in FLINK_DOCUMENTS:
        assert MISSPELT[document["kind"]] and WRONG_TYPE[document["kind"]], name
    for parent, _, _ in (case for cases in MISSPELT.values() for case in cases):
        assert len(_tokens(parent)) >= 2  # the misspelt field is one deeper
    for path, _, _ in (case for cases in WRONG_TYPE.values() for case in cases):
        assert len(_tokens(path)) >= 3


def test_flink_version_is_the_pinned_flinks_and_known_to_operator_1_15(operator_api_jar, validators):
    major, minor = PINNED_FLINK.split(".")[:2]
    for _, document in FLINK_DOCUMENTS:
        if document["kind"] == "FlinkDeployment":
            assert document["spec"]["flinkVersion"] == f"v{major}_{minor}"
            assert document["spec"]["flinkVersion"] in OPERATOR_1_15_FLINK_VERSIONS
    # Why the field is relaxed: the CRD checked here predates it. Once the jar's operator knows it, drop the relaxing.
    known = crd_schema(operator_api_jar, "FlinkDeployment")["properties"]["spec"]["properties"]["flinkVersion"]["enum"]
    assert f"v{major}_{minor}" not in known and known[-1] == "v1_20"
    # Relaxed is not unchecked: the field is still a string.
    broken = copy.deepcopy(PRODUCTION)
    broken["spec"]["flinkVersion"] = 23
    (error,) = errors_of(validators["FlinkDeployment"], broken)
    assert (where(error), error.validator) == ("spec.flinkVersion", "type")


def test_strict_schema_keeps_int_or_string_and_preserved_fields_open():
    schema = strict({
        "type": "object",
        "properties": {
            "limits": {"type": "object", "additionalProperties": {
                "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}},
            "port": {"x-kubernetes-int-or-string": True},
            "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                       "properties": {"known": {"type": "string"}}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
        },
    })
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    fine = {"limits": {"cpu": 1, "memory": "1Gi"}, "port": "http", "config": {"known": "x", "any": {"a": 1}}}
    assert not list(validator.iter_errors(fine))
    cases = {"limits.cpu": {"limits": {"cpu": [1]}}, "port": {"port": 1.5}, "items[0]": {"items": [{"b": "x"}]},
             "": {"other": 1}}
    for path, document in cases.items():
        (error,) = list(validator.iter_errors(document))
        assert where(error) == path, error.message


# --- what no CRD checks -----------------------------------------------------------------------------------------

def test_names_and_configuration_pass_the_operators_own_rules():
    for name, document in DEPLOYMENTS.items():
        assert DEPLOYMENT_NAME.fullmatch(name), name
        configuration = document["spec"]["flinkConfiguration"]
        assert not set(configuration) & set(FORBIDDEN_CONF_KEYS)
        assert all(isinstance(value, str) for value in configuration.values())


def test_flink_configuration_runs_python_as_the_image_does():
    image_settings = dict(re.findall(r"-D([\w.-]+)=(\S+)", DOCKERFILE.read_text()))
    assert image_settings["python.execution-mode"] == "thread"
    for document in DEPLOYMENTS.values():
        configuration = document["spec"]["flinkConfiguration"]
        assert {key: configuration.get(key) for key in image_settings} == image_settings
    assert PRODUCTION["spec"]["image"] == REPLAY["spec"]["image"]


def test_signing_key_comes_from_the_secret_for_every_pod():
    (secret,) = SECRETS
    for document in DEPLOYMENTS.values():
        # The deployment-wide pod template: JobManager and TaskManagers alike.
        (container,) = document["spec"]["podTemplate"]["spec"]["containers"]
        assert container["name"] == "flink-main-container"
        env = {variable["name"]: variable for variable in container["env"]}
        reference = env[SIGNING_KEY_ENV]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret["metadata"]["name"] and reference["key"] in secret["stringData"]
        assert "optional" not in reference
        for variable in env.values():
            assert "value" not in variable, "secrets come from the Secret, never inline"
        assert not {"--signing-key", "--signing-key-file"} & set(document["spec"]["job"]["args"])
    # The example's placeholder is no usable key (16 characters at least): applied unchanged, the jobs refuse it.
    assert len(secret["stringData"]["signing-key"]) < 16
    assert "REPLACE-ME" in secret["stringData"]["signing-key"]


@pytest.mark.parametrize("module", [AGENT_JOB, REPLAY_JOB])
def test_jobs_run_the_packaged_entry_points_with_arguments_they_accept(monkeypatch, capsys, module):
    (document,) = [doc for doc in DEPLOYMENTS.values() if _job_module(doc) == module]
    job = document["spec"]["job"]
    assert job["jarURI"] == f"local:///opt/flink/opt/flink-python-{PINNED_FLINK}.jar"
    assert job["entryClass"] == PYTHON_DRIVER
    assert job["args"][:2] == ["-pym", module]
    monkeypatch.setenv(SIGNING_KEY_ENV, "a-test-signing-key-of-32-characters")
    try:
        args = importlib.import_module(module).parse_args(job["args"][2:])
    except SystemExit:
        pytest.fail(f"{module} refuses the manifest's arguments: {capsys.readouterr().err}")
    assert args.parallelism == job["parallelism"]  # the operator sizes the TaskManagers from spec.job.parallelism
    if module == REPLAY_JOB:
        agent_module, _, factory = args.agent.partition(":")
        assert callable(getattr(importlib.import_module(agent_module), factory))


def test_production_upgrades_through_savepoints_with_kubernetes_ha():
    spec = PRODUCTION["spec"]
    configuration = spec["flinkConfiguration"]
    assert (spec["job"]["upgradeMode"], spec["job"]["state"]) == ("savepoint", "running")
    assert configuration["high-availability.type"] == "kubernetes"
    for key in ("high-availability.storageDir", "execution.checkpointing.dir", "execution.checkpointing.savepoint-dir"):
        assert configuration[key].startswith("s3://"), key
    assert "--capture" in spec["job"]["args"]


def test_savepoint_for_replays_is_taken_of_production_and_kept():
    (snapshot,) = SNAPSHOTS
    assert snapshot["spec"]["jobReference"] == {"kind": "FlinkDeployment", "name": PRODUCTION["metadata"]["name"]}
    assert snapshot["spec"]["savepoint"]["disposeOnDelete"] is False
    assert "path" not in snapshot["spec"]["savepoint"]  # the production job's savepoint-dir
    assert DEPLOYMENT_NAME.fullmatch(snapshot["metadata"]["name"])


def test_replay_starts_once_from_a_savepoint_of_production():
    production = PRODUCTION["spec"]
    spec = REPLAY["spec"]
    args = spec["job"]["args"]
    assert spec["job"]["upgradeMode"] == "stateless"
    assert not any(key.startswith("high-availability") for key in spec["flinkConfiguration"])
    assert spec["flinkConfiguration"]["kubernetes.operator.job.restart.failed"] == "false"
    assert _option(args, "--savepoint") == spec["job"]["initialSavepointPath"]
    savepoints = production["flinkConfiguration"]["execution.checkpointing.savepoint-dir"]
    assert spec["job"]["initialSavepointPath"].startswith(savepoints + "/")
    assert spec["flinkConfiguration"]["execution.checkpointing.dir"] != production["flinkConfiguration"][
        "execution.checkpointing.dir"]
    # The production job's identity: its agent (uid, topics), its outputs and its key groups.
    production_args = production["job"]["args"]
    assert _option(args, "--agent-id") == _option(production_args, "--agent-id")
    assert _option(args, "--output-topic") == _option(production_args, "--output-topic")
    assert _option(args, "--bootstrap-servers") == _option(production_args, "--bootstrap-servers")
    # The main job keeps AgentConfig's max parallelism (it has no option for it): the agent's key groups.
    assert "--max-parallelism" not in production_args
    assert int(_option(args, "--max-parallelism")) == AgentConfig().max_parallelism
