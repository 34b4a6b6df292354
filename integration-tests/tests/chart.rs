//! The Helm chart (`deploy/helm/sluice`) against the code and Kubernetes: `helm
//! lint --strict`, then each rendering (the defaults, the production example,
//! plaintext Kafka) validated against the Kubernetes schemas of the oldest and
//! newest versions the chart supports (`kubernetes-validate`, offline), then read
//! back: StatefulSets whose ordinal is the instance, a startup probe, a
//! restricted security context, selectors, PodDisruptionBudgets, no secret
//! written in, every `SLUICE_*` name one the services read, and Strimzi
//! `KafkaUser`s with exactly the ACLs the services check themselves against.
//!
//! `compose/test.sh` provides the tools (SLUICE_TEST_HELM,
//! SLUICE_TEST_KUBERNETES_VALIDATE); `compose/lib.sh`'s `ensure_kube_tools` installs them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use sluice_kit::access::{self, Operation, ResourceKind};

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/sluice")
}

fn tool(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run through compose/test.sh, or source compose/lib.sh and call ensure_kube_tools")
    })
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?}:\n{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart rendered with `args`, linted and schema-checked; its objects.
fn render(name: &str, args: &[&str]) -> Vec<Value> {
    let helm = tool("SLUICE_TEST_HELM");
    let dir = chart().display().to_string();
    let mut lint = vec!["lint", "--strict", &dir];
    lint.extend(args);
    run(&helm, &lint);
    let mut template = vec!["template", "sluice", &dir];
    template.extend(args);
    let yaml = run(&helm, &template);
    let file = std::env::temp_dir().join(sluice_integration_tests::unique(&format!(
        "chart-{name}.yaml"
    )));
    std::fs::write(&file, &yaml).expect("write the rendering");
    let validate = tool("SLUICE_TEST_KUBERNETES_VALIDATE");
    for version in ["1.28.0", "1.37.0"] {
        let out = Command::new(&validate)
            .args(["--strict", "-k", version, &file.display().to_string()])
            .output()
            .expect("kubernetes-validate");
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        // Strimzi's KafkaUser is a custom resource: no schema here; read back below.
        let problems: Vec<&str> = said
            .lines()
            .filter(|l| !l.starts_with("INFO") && !l.contains("kind KafkaUser"))
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(
            out.status.success() && problems.is_empty(),
            "{name} against Kubernetes {version}:\n{said}"
        );
    }
    serde_norway::Deserializer::from_str(&yaml)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).ok()?;
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn env_names(container: &Value) -> Vec<String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

/// What every rendering must be, whatever the values.
fn check_workloads(objects: &[Value]) {
    assert!(of_kind(objects, "Deployment").is_empty(), "no Deployments");
    let sets = of_kind(objects, "StatefulSet");
    let components: BTreeSet<&str> = sets
        .iter()
        .filter_map(|s| s["metadata"]["labels"]["app.kubernetes.io/component"].as_str())
        .collect();
    assert_eq!(
        components,
        BTreeSet::from(["api", "dispatcher", "ingester", "resolver", "state-updater"])
    );
    let known: BTreeSet<&str> = sluice_kit::config::KNOWN.iter().copied().collect();
    let config = of_kind(objects, "ConfigMap")[0];
    for name in config["data"].as_object().expect("data").keys() {
        assert!(
            known.contains(name.as_str()) || name.starts_with("SLUICE_RDKAFKA_"),
            "ConfigMap sets {name}, which no service reads"
        );
    }
    let pdbs = of_kind(objects, "PodDisruptionBudget");
    for s in &sets {
        let name = s["metadata"]["name"].as_str().expect("name");
        let selector = &s["spec"]["selector"]["matchLabels"];
        for label in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
        ] {
            assert!(selector[label].is_string(), "{name} selects by {label}");
        }
        assert!(
            pdbs.iter()
                .any(|p| p["spec"]["selector"]["matchLabels"] == *selector),
            "{name} has a PodDisruptionBudget"
        );
        let service = s["spec"]["serviceName"].as_str().expect("serviceName");
        assert!(
            of_kind(objects, "Service")
                .iter()
                .any(|v| v["metadata"]["name"] == service
                    && v["spec"]["clusterIP"] == "None"
                    && v["spec"]["selector"] == *selector),
            "{name}'s headless Service {service}"
        );
        let pod = &s["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let c = &pod["containers"][0];
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{name}");
        assert_eq!(
            c["startupProbe"]["httpGet"]["path"], "/health/live",
            "{name}"
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"]["path"], "/health/live",
            "{name}"
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"]["path"], "/health/ready",
            "{name}"
        );
        let instance = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "SLUICE_INSTANCE")
            .unwrap_or_else(|| panic!("{name} sets SLUICE_INSTANCE"));
        assert_eq!(
            instance["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['apps.kubernetes.io/pod-index']",
            "{name}: the instance is the StatefulSet ordinal"
        );
        for env in c["env"].as_array().expect("env") {
            let n = env["name"].as_str().expect("name");
            assert!(
                known.contains(n) || n.starts_with("SLUICE_RDKAFKA_"),
                "{name} sets {n}, which no service reads"
            );
            if n.contains("PASSWORD") || n.ends_with("DATABASE_URL") {
                assert!(
                    env["valueFrom"]["secretKeyRef"].is_object(),
                    "{name}: {n} comes from a Secret, never written in"
                );
            }
        }
    }
}

#[test]
fn the_default_rendering_is_valid_and_keeps_the_services_guarantees() {
    let objects = render("default", &[]);
    check_workloads(&objects);
    assert!(
        of_kind(&objects, "KafkaUser").is_empty(),
        "Strimzi users only when asked"
    );
    let set = of_kind(&objects, "StatefulSet")[0];
    let c = &set["spec"]["template"]["spec"]["containers"][0];
    assert!(
        env_names(c).contains(&"SLUICE_RDKAFKA_SASL_PASSWORD".to_owned()),
        "SASL_SSL by default"
    );
}

#[test]
fn plaintext_kafka_renders_without_credentials() {
    let objects = render("plaintext", &["--set", "kafka.securityProtocol=PLAINTEXT"]);
    check_workloads(&objects);
    for s in of_kind(&objects, "StatefulSet") {
        let names = env_names(&s["spec"]["template"]["spec"]["containers"][0]);
        assert!(!names.iter().any(|n| n.contains("SASL")), "{names:?}");
    }
}

/// The worked example: digest-pinned image, CAs from Secrets, and a Strimzi
/// KafkaUser per principal whose ACLs are exactly the access table's.
#[test]
fn the_production_example_grants_each_principal_exactly_its_acls() {
    let values = chart()
        .join("examples/production-values.yaml")
        .display()
        .to_string();
    let objects = render("production", &["-f", &values]);
    check_workloads(&objects);
    for s in of_kind(&objects, "StatefulSet") {
        let c = &s["spec"]["template"]["spec"]["containers"][0];
        assert!(
            c["image"].as_str().expect("image").contains("@sha256:"),
            "pinned by digest"
        );
        assert!(env_names(c).contains(&"SLUICE_RDKAFKA_SSL_CA_LOCATION".to_owned()));
    }
    let users = of_kind(&objects, "KafkaUser");
    assert_eq!(users.len(), access::ALL.len());
    for a in access::ALL {
        let name = format!("sluice-{}", a.service);
        let user = users
            .iter()
            .find(|u| u["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("a KafkaUser {name}"));
        assert_eq!(
            user["metadata"]["labels"]["strimzi.io/cluster"],
            "my-cluster"
        );
        let mut granted = BTreeSet::new();
        for acl in user["spec"]["authorization"]["acls"]
            .as_array()
            .expect("acls")
        {
            let r = &acl["resource"];
            for op in acl["operations"].as_array().expect("operations") {
                granted.insert((
                    r["type"].as_str().expect("type").to_owned(),
                    r["name"].as_str().expect("name").to_owned(),
                    r["patternType"] == "prefix",
                    op.as_str().expect("op").to_owned(),
                ));
            }
        }
        let hooks = if *a == access::INGESTER {
            vec!["lake.commit-hooks".to_owned()]
        } else {
            Vec::new()
        };
        let wanted: BTreeSet<(String, String, bool, String)> = a
            .acls("sluice.", &hooks)
            .into_iter()
            .map(|acl| {
                let kind = match acl.kind {
                    ResourceKind::Topic => "topic",
                    ResourceKind::Group => "group",
                    ResourceKind::TransactionalId => "transactionalId",
                };
                (
                    kind.to_owned(),
                    acl.name,
                    acl.prefixed,
                    acl.operation.to_string(),
                )
            })
            .collect();
        assert_eq!(granted, wanted, "{name}'s ACLs");
        // A principal that only reads never writes (the CLI writes only dependencies).
        if a.writes.is_empty() {
            assert!(!granted.iter().any(|g| g.3 == Operation::Write.to_string()));
        }
    }
}
