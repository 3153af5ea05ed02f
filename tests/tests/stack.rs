//! Checks of the deployable stack that AWS only makes at deploy time (docs/ARCHITECTURE.md, Tests), on
//! `template.yaml` as written: every lane queue has a DLQ and a visibility at least its consumer's
//! timeout; every event source mapping reports batch item failures with `MaximumConcurrency` >= 2 and
//! the batching of docs/ARCHITECTURE.md (Lanes); every function gets the variables its configuration requires; IAM
//! allows every AWS call the code makes. Also: every sample in `events/` decodes as the event its
//! function takes. (`cfn-lint`, `sam validate --lint` and the arm64 builds run in `make test` too.)

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::workspace_root;
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};

fn template() -> Value {
    serde_norway::from_str(&std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap()).unwrap()
}

fn resources(t: &Value) -> BTreeMap<String, Value> {
    t["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

/// The logical id a `!Ref X` or `!GetAtt X.Attr` points at.
fn target(v: &Value) -> String {
    match v {
        Value::Tagged(t) if t.tag == "!Ref" || t.tag == "!GetAtt" => {
            t.value.as_str().unwrap().split('.').next().unwrap().to_owned()
        }
        other => panic!("expected !Ref or !GetAtt, got {other:?}"),
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v:?}"))
}

fn functions(t: &Value) -> BTreeMap<String, Value> {
    resources(t).into_iter().filter(|(_, r)| r["Type"] == "AWS::Serverless::Function").collect()
}

fn timeout(t: &Value, f: &Value) -> u64 {
    num(if f["Properties"]["Timeout"].is_null() {
        &t["Globals"]["Function"]["Timeout"]
    } else {
        &f["Properties"]["Timeout"]
    })
}

fn env(t: &Value, f: &Value) -> BTreeMap<String, Value> {
    let mut vars = BTreeMap::new();
    for source in
        [&t["Globals"]["Function"]["Environment"]["Variables"], &f["Properties"]["Environment"]["Variables"]]
    {
        if let Some(m) = source.as_mapping() {
            for (k, v) in m {
                vars.insert(k.as_str().unwrap().to_owned(), v.clone());
            }
        }
    }
    vars
}

fn binary(f: &Value) -> String {
    f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap().to_owned()
}

/// Every `Action` allowed to the function, with the resources it is allowed on (`!If` branches
/// included: a conditional statement counts as allowed).
fn allowed(f: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut statements: Vec<Value> = Vec::new();
    for policy in f["Properties"]["Policies"].as_sequence().unwrap() {
        for s in policy["Statement"].as_sequence().unwrap() {
            match s {
                Value::Tagged(t) if t.tag == "!If" => {
                    statements.push(t.value.as_sequence().unwrap()[1].clone())
                }
                s => statements.push(s.clone()),
            }
        }
    }
    for s in statements {
        assert_eq!(s["Effect"], "Allow");
        let resources = match &s["Resource"] {
            Value::Sequence(r) => r.clone(),
            r => vec![r.clone()],
        };
        let actions = match &s["Action"] {
            Value::Sequence(a) => a.iter().map(|a| a.as_str().unwrap().to_owned()).collect(),
            a => vec![a.as_str().unwrap().to_owned()],
        };
        for a in actions {
            assert!(!a.contains('*'), "no wildcard actions: {a}");
            out.entry(a).or_default().extend(resources.clone());
        }
    }
    out
}

const LANES: [(&str, &str); 3] =
    [("interactive", "Interactive"), ("synthesis", "Synthesis"), ("commits", "Commits")];

#[test]
fn every_lane_queue_has_a_dlq_and_outlasts_its_consumer() {
    let t = template();
    let r = resources(&t);
    let mappings: Vec<(&String, &Value)> =
        r.iter().filter(|(_, v)| v["Type"] == "AWS::Lambda::EventSourceMapping").collect();
    assert_eq!(mappings.len(), 3, "one mapping per lane");
    for (lane, title) in LANES {
        let queue_id = format!("{title}Queue");
        let queue = &r[&queue_id];
        assert_eq!(queue["Properties"]["SqsManagedSseEnabled"], true, "{queue_id}: SSE");
        let redrive = &queue["Properties"]["RedrivePolicy"];
        let dlq = target(&redrive["deadLetterTargetArn"]);
        assert_eq!(r[&dlq]["Type"], "AWS::SQS::Queue", "{queue_id}: DLQ");
        assert_eq!(r[&dlq]["Properties"]["SqsManagedSseEnabled"], true, "{dlq}: SSE");
        assert_eq!(target(&redrive["maxReceiveCount"]), "MaxReceiveCount");

        let (id, m) = mappings
            .iter()
            .find(|(_, m)| target(&m["Properties"]["EventSourceArn"]) == queue_id)
            .unwrap_or_else(|| panic!("no mapping for {queue_id}"));
        let p = &m["Properties"];
        let function_id = target(&p["FunctionName"]);
        let function = &r[&function_id];
        assert_eq!(binary(function), "worker");
        assert_eq!(env(&t, function)["LANES_LANE"], lane, "{function_id} consumes {queue_id}");
        let visibility = num(&queue["Properties"]["VisibilityTimeout"]);
        let timeout = timeout(&t, function);
        assert!(
            visibility >= timeout,
            "{queue_id}: visibility {visibility} < {function_id} timeout {timeout}"
        );
        assert!(num(&p["ScalingConfig"]["MaximumConcurrency"]) >= 2, "{id}: MaximumConcurrency >= 2");
        assert_eq!(p["FunctionResponseTypes"][0], "ReportBatchItemFailures", "{id}");
        let (batch, window) = (num(&p["BatchSize"]), num(&p["MaximumBatchingWindowInSeconds"]));
        assert!(batch <= 10 || window >= 1, "{id}: a batch over 10 needs a batching window");
        let want = match lane {
            "interactive" => (1..=10).contains(&batch) && window == 0 && timeout == 30,
            "synthesis" => batch == 1 && window == 0 && timeout == 900,
            _ => batch == 100 && window == 2 && timeout == 300,
        };
        assert!(
            want,
            "{id}: batch {batch}, window {window}, timeout {timeout} differ from docs/ARCHITECTURE.md (Lanes)"
        );
        assert!(
            t["Resources"]["ControllerFunction"]["Properties"]["Environment"]["Variables"]
                [format!("LANES_MAPPING_{}", lane.to_uppercase()).as_str()]
            .is_tagged(),
            "the controller knows {id}"
        );
    }
}

trait Tagged {
    fn is_tagged(&self) -> bool;
}

impl Tagged for Value {
    fn is_tagged(&self) -> bool {
        matches!(self, Value::Tagged(_))
    }
}

#[test]
fn every_function_gets_the_variables_its_configuration_requires() {
    let t = template();
    let backend = [
        "LANES_BACKEND",
        "LANES_TABLE",
        "LANES_QUEUE_URL_INTERACTIVE",
        "LANES_QUEUE_URL_SYNTHESIS",
        "LANES_QUEUE_URL_COMMITS",
        "REDIS_URL",
    ];
    for (id, f) in functions(&t) {
        let vars = env(&t, &f);
        let mut need: Vec<&str> = match binary(&f).as_str() {
            "ingress" => backend.to_vec(),
            "webhook" => [
                &backend[..],
                &[
                    "LANES_GITHUB_WEBHOOK_SECRET_ID",
                    "LANES_GITLAB_WEBHOOK_TOKEN_ID",
                    "LANES_WEBHOOK_OWNER_SECRETS_ID",
                ],
            ]
            .concat(),
            "worker" => {
                [&backend[..], &["LANES_LANE", "LANES_LLM_PROVIDER", "LANES_LLM_API_KEY_SECRET"]].concat()
            }
            "controller" => vec![
                "LANES_QUEUE_URL_INTERACTIVE",
                "LANES_QUEUE_URL_SYNTHESIS",
                "LANES_QUEUE_URL_COMMITS",
                "LANES_MAPPING_INTERACTIVE",
                "LANES_MAPPING_SYNTHESIS",
                "LANES_MAPPING_COMMITS",
                "LANES_CONCURRENCY_BUDGET",
            ],
            other => panic!("{id}: unknown binary {other}"),
        };
        if vars.get("LANES_LANE").is_some_and(|l| l == "commits") {
            need.extend(["LANES_GITHUB_TOKEN_SECRET", "LANES_GITLAB_API_TOKEN_SECRET"]);
        }
        for n in need {
            assert!(vars.contains_key(n), "{id} lacks {n}");
        }
        assert_eq!(vars["LANES_BACKEND"], "aws");
        let redis = format!("{:?}", vars["REDIS_URL"]);
        assert!(redis.contains("rediss://"), "{id}: TLS to the cache: {redis}");
    }
    // Whatever the code requires by name is set somewhere in the template.
    let text = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    for file in [
        "shared/src/wiring/mod.rs",
        "shared/src/wiring/llm.rs",
        "shared/src/lambda/startup.rs",
        "shared/src/lambda/handlers.rs",
        "shared/src/lambda/batch.rs",
    ] {
        let src = std::fs::read_to_string(workspace_root().join(file)).unwrap();
        for part in src.split("require_env(\"").skip(1) {
            let name = part.split('"').next().unwrap();
            assert!(
                text.contains(&format!("{name}:")),
                "{file} requires {name}, which template.yaml never sets"
            );
        }
    }
}

#[test]
fn iam_allows_every_call_the_code_makes_and_nothing_broader() {
    let t = template();
    let fs = functions(&t);
    let by_id = |id: &str| allowed(&fs[id]);
    const QUEUE: [&str; 6] = [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
        "sqs:SendMessage",
    ];
    let task_worker = [
        &QUEUE[..],
        &[
            "dynamodb:GetItem",
            "dynamodb:UpdateItem",
            "secretsmanager:GetSecretValue",
            "bedrock:InvokeModel",
            "s3:PutObject",
        ],
    ]
    .concat();
    let commits_worker = [
        &QUEUE[..],
        &[
            "dynamodb:BatchGetItem",
            "dynamodb:PutItem",
            "secretsmanager:GetSecretValue",
            "bedrock:InvokeModel",
        ],
    ]
    .concat();
    let need: &[(&str, &[&str])] = &[
        (
            "IngressFunction",
            &[
                "dynamodb:PutItem",
                "dynamodb:GetItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:BatchGetItem",
                "dynamodb:Query",
                "sqs:SendMessage",
                "s3:GetObject",
            ],
        ),
        (
            "WebhookFunction",
            &["dynamodb:PutItem", "dynamodb:GetItem", "sqs:SendMessage", "secretsmanager:GetSecretValue"],
        ),
        ("InteractiveWorkerFunction", &task_worker),
        ("SynthesisWorkerFunction", &task_worker),
        ("CommitsWorkerFunction", &commits_worker),
        (
            "ControllerFunction",
            &[
                "sqs:GetQueueAttributes",
                "sqs:GetQueueUrl",
                "sqs:ReceiveMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:DeleteMessage",
                "sqs:SendMessage",
                "dynamodb:UpdateItem",
                "dynamodb:GetItem",
                "dynamodb:BatchGetItem",
                "lambda:GetEventSourceMapping",
                "lambda:UpdateEventSourceMapping",
            ],
        ),
    ];
    // The controller may update this stack's three mappings and no other.
    let esm: Vec<String> = by_id("ControllerFunction")["lambda:UpdateEventSourceMapping"]
        .iter()
        .map(|r| format!("{r:?}"))
        .collect();
    assert_eq!(esm.len(), 3, "{esm:?}");
    for (r, mapping) in esm.iter().zip(["InteractiveMapping", "SynthesisMapping", "CommitsMapping"]) {
        assert!(r.contains(&format!("event-source-mapping:${{{mapping}}}")), "{r}");
    }
    // Bedrock: foundation models and this account's (cross-region) inference profiles.
    for id in ["InteractiveWorkerFunction", "SynthesisWorkerFunction", "CommitsWorkerFunction"] {
        let bedrock = format!("{:?}", by_id(id)["bedrock:InvokeModel"]);
        assert!(bedrock.contains("::foundation-model/"), "{id}: {bedrock}");
        assert!(bedrock.contains(":${AWS::AccountId}:inference-profile/"), "{id}: {bedrock}");
    }
    let mut granted = BTreeSet::new();
    for (id, actions) in need {
        let allowed = by_id(id);
        for a in *actions {
            assert!(allowed.contains_key(*a), "{id} may not {a}");
        }
        granted.extend(allowed.keys().cloned());
        // Least privilege: nothing on "*".
        for (a, resources) in &allowed {
            for r in resources {
                assert_ne!(r.as_str(), Some("*"), "{id}: {a} on *");
            }
        }
    }
    // Every AWS operation the adapters call is granted to some function: each SDK call is
    // `client.<operation>()` in the adapter of its service. Operations only `lanes dev --create`
    // makes are not deployed; the DLQ move task is the operator's (`lanes dlq redrive --move-task`).
    let local_only = [
        "sqs:CreateQueue",
        "sqs:SetQueueAttributes",
        "dynamodb:CreateTable",
        "dynamodb:UpdateTimeToLive",
        "dynamodb:DescribeTable",
        "sqs:StartMessageMoveTask",
        "sqs:ListMessageMoveTasks",
        "s3:CreateBucket",
    ];
    let pascal = |snake: &str| -> String {
        snake
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
            })
            .collect()
    };
    let mut calls = BTreeSet::new();
    let adapters = workspace_root().join("shared/src/adapters");
    let mut files = vec![
        ("lambda", adapters.join("lambda.rs")),
        ("secretsmanager", adapters.join("secrets.rs")),
        ("s3", adapters.join("s3.rs")),
    ];
    for (service, dir) in [("sqs", "sqs"), ("dynamodb", "dynamodb")] {
        for entry in std::fs::read_dir(adapters.join(dir)).unwrap() {
            files.push((service, entry.unwrap().path()));
        }
    }
    for (service, path) in files {
        let src = std::fs::read_to_string(&path).unwrap();
        for part in src.split("client").skip(1) {
            let Some(rest) = part.trim_start().strip_prefix('.') else { continue };
            let op: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if op.is_empty() || op == "clone" || !rest[op.len()..].starts_with("()") {
                continue;
            }
            // SQS batch calls are authorized by the single-message action.
            calls.insert(format!("{service}:{}", pascal(&op).trim_end_matches("Batch")));
        }
    }
    assert!(calls.len() >= 12, "{calls:?}");
    for call in calls.iter().filter(|c| !local_only.contains(&c.as_str())) {
        assert!(granted.contains(call), "the code calls {call}; no function may");
    }
}

#[test]
fn the_api_is_iam_or_jwt_and_the_webhook_url_is_open_by_design() {
    let t = template();
    let r = resources(&t);
    let route = &r["V1Route"]["Properties"];
    assert_eq!(route["RouteKey"], "ANY /v1/{proxy+}");
    let auth = format!("{:?}", route["AuthorizationType"]);
    assert!(auth.contains("JWT") && auth.contains("AWS_IAM"), "IAM by default, JWT when configured: {auth}");
    assert_eq!(r["WebhookFunction"]["Properties"]["FunctionUrlConfig"]["AuthType"], "NONE");
    let table = &r["Table"]["Properties"];
    assert_eq!(table["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(table["TimeToLiveSpecification"]["AttributeName"], "expires_at");
    assert_eq!(table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"], true);
    assert_eq!(table["SSESpecification"]["SSEEnabled"], true);
    assert_eq!(table["GlobalSecondaryIndexes"][0]["IndexName"], "by_repo");
    assert_eq!(r["Cache"]["Properties"]["Engine"], "valkey");
    for f in functions(&t).values() {
        let runtime = if f["Properties"]["Runtime"].is_null() {
            &t["Globals"]["Function"]["Runtime"]
        } else {
            &f["Properties"]["Runtime"]
        };
        assert_eq!(runtime, "provided.al2023");
        assert_eq!(t["Globals"]["Function"]["Architectures"][0], "arm64");
        assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda");
        assert!(f["Properties"]["LoggingConfig"]["LogGroup"].is_tagged(), "log group with retention");
    }
    let outputs: Vec<&str> = t["Outputs"].as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
    for o in
        ["ApiUrl", "WebhookUrl", "InteractiveQueueUrl", "SynthesisQueueUrl", "CommitsQueueUrl", "TableName"]
    {
        assert!(outputs.contains(&o), "output {o}");
    }
}

#[test]
fn every_sample_event_decodes_as_its_function_takes_it() {
    use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
    use aws_lambda_events::event::sqs::SqsEvent;
    let read = |name: &str| std::fs::read_to_string(workspace_root().join("events").join(name)).unwrap();
    for (file, lane) in [
        ("sqs-interactive.json", "interactive"),
        ("sqs-synthesis.json", "synthesis"),
        ("sqs-commits.json", "commits"),
    ] {
        let e: SqsEvent = serde_json::from_str(&read(file)).unwrap();
        let m = lanes_core::lambda::received_from_sqs(&e.records[0]).unwrap();
        assert_eq!(m.attributes["lane"], lane, "{file}");
        if lane == "commits" {
            let c: lanes_core::domain::commit::CommitMessage = serde_json::from_str(&m.body).unwrap();
            c.validate().unwrap();
        } else {
            let t: lanes_core::domain::TaskMessage = serde_json::from_str(&m.body).unwrap();
            assert_eq!(t.lane.as_str(), lane, "{file}");
        }
    }
    // `sam local invoke -e events/<event> --env-vars events/env.json <Function>`: every function
    // named there exists and runs on the embedded backend (no AWS needed).
    let local_env: serde_json::Value = serde_json::from_str(&read("env.json")).unwrap();
    let fs = functions(&template());
    let t = template();
    for (function, vars) in local_env.as_object().unwrap() {
        assert!(fs.contains_key(function), "env.json names {function}, which the template does not define");
        assert_eq!(vars["LANES_BACKEND"], "embedded", "{function}");
        // `sam local` only overrides variables the template declares for the function.
        let declared = env(&t, &fs[function]);
        for key in vars.as_object().unwrap().keys() {
            assert!(
                declared.contains_key(key),
                "env.json sets {key} for {function}, which the template does not declare"
            );
        }
    }
    // Only events live in events/ (fixtures are in tests/fixtures/), and each is checked here.
    let checked = [
        "sqs-interactive.json",
        "sqs-synthesis.json",
        "sqs-commits.json",
        "scheduled-controller.json",
        "api-post-task.json",
        "api-get-task.json",
        "function-url-task-events.json",
        "webhook-github-push.json",
        "webhook-gitlab-push.json",
        "env.json",
    ];
    for entry in std::fs::read_dir(workspace_root().join("events")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(checked.contains(&name.as_str()), "events/{name} is not a checked sample event");
    }
    let tick: CloudWatchEvent = serde_json::from_str(&read("scheduled-controller.json")).unwrap();
    assert_eq!(tick.detail_type.as_deref(), Some("Scheduled Event"));
    for (file, method) in [("api-post-task.json", "POST"), ("api-get-task.json", "GET")] {
        let raw: serde_json::Value = serde_json::from_str(&read(file)).unwrap();
        assert_eq!(raw["routeKey"], "ANY /v1/{proxy+}", "{file}: the template's only API route");
        let req: lambda_http::request::LambdaRequest = serde_json::from_str(&read(file)).unwrap();
        let req: lambda_http::Request = req.into();
        assert_eq!(req.method().as_str(), method, "{file}");
        assert!(req.uri().path().starts_with("/v1/tasks"), "{file}");
    }
    // The streamed route's function URL event: a GET of a task's events, by an IAM caller.
    let req: lambda_http::request::LambdaRequest =
        serde_json::from_str(&read("function-url-task-events.json")).unwrap();
    let req: lambda_http::Request = req.into();
    assert_eq!(req.method().as_str(), "GET");
    assert!(req.uri().path().starts_with("/v1/tasks/") && req.uri().path().ends_with("/events"));
    for (file, secret) in [
        ("webhook-github-push.json", "lanes-local-webhook-secret"),
        ("webhook-gitlab-push.json", "lanes-local-gitlab-token"),
    ] {
        let req: lambda_http::request::LambdaRequest = serde_json::from_str(&read(file)).unwrap();
        let req: lambda_http::Request = req.into();
        let body = req.body().to_vec();
        let h = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        if let Some(sig) = h("x-hub-signature-256") {
            assert!(
                lanes_core::commits::webhook::verify_github(secret.as_bytes(), &body, Some(&sig)),
                "{file}"
            );
            let push =
                lanes_core::commits::push::parse_push(lanes_core::domain::commit::Provider::Github, &body)
                    .unwrap();
            assert_eq!(push.commits.len(), 2);
        } else {
            assert!(
                lanes_core::commits::webhook::verify_gitlab(secret, h("x-gitlab-token").as_deref()),
                "{file}"
            );
            let push =
                lanes_core::commits::push::parse_push(lanes_core::domain::commit::Provider::Gitlab, &body)
                    .unwrap();
            assert_eq!(push.commits.len(), 1);
        }
    }
}

/// The metrics the code can emit in EMF, as `name -> dimension names`, read from the source so a
/// new counter or label value is seen without a list kept by hand:
/// - histograms (`Latency`), per lane;
/// - counters: each family defined in `metrics/mod.rs` (`field: r.counter("lanes_…_total", …, &[labels])`,
///   `r.cost(…)`, or a `pub static` with `Opts::new("lanes_…_total", …), &[labels]`), with the label values its call sites pass as
///   literals (`.<field>.with_label_values(&[lane, "prompt"])`), named by the core's own
///   `emf_name`; a non-literal value of a non-dimension label is a wildcard (`*`);
/// - the controller's hand-written documents (`{"Name": "queue_depth", …}` in `lambda/handlers.rs`), per lane.
fn emitted_metrics() -> BTreeMap<String, BTreeSet<String>> {
    use lanes_core::metrics::{EMF_DIMENSIONS, Latency, emf_name};
    let root = workspace_root().join("shared/src");
    let metrics_rs = std::fs::read_to_string(root.join("metrics/mod.rs")).unwrap();
    let mut out = BTreeMap::new();
    for l in Latency::ALL {
        out.insert(l.name().to_owned(), BTreeSet::from([l.label().to_owned()]));
    }
    // Family definitions: the field (or static) name before, the family name and label list.
    let mut families: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let quoted = |s: &str| -> Vec<String> { s.split('"').skip(1).step_by(2).map(str::to_owned).collect() };
    let label_lists: BTreeMap<&str, Vec<String>> = metrics_rs
        .lines()
        .filter_map(|l| l.strip_prefix("const ")?.split_once(": &[&str] = &["))
        .map(|(name, rest)| (name, quoted(rest.split(']').next().unwrap_or(""))))
        .collect();
    // Gauges (`field: r.gauge("lanes_…", …)`, labelled by lane) of those EMF reports.
    for line in metrics_rs.lines() {
        if let Some((field, rest)) = line.trim().split_once(": r.gauge(\"") {
            let family = rest.split('"').next().unwrap();
            if lanes_core::metrics::EMF_GAUGES.contains(&family) {
                families.insert(field.to_owned(), (family.to_owned(), vec!["lane".to_owned()]));
            }
        }
    }
    for part in metrics_rs.split("\"lanes_").skip(1) {
        let family = format!("lanes_{}", part.split('"').next().unwrap());
        if !family.ends_with("_total") {
            continue;
        }
        // The labels: a named list (`const LANE: &[&str] = &["lane"];`) as the call's last argument,
        // or the first literal list after the name.
        let args = part.split(')').next().unwrap_or("");
        let last_arg = args.rsplit(',').map(str::trim).find(|a| !a.is_empty()).unwrap_or("");
        let labels = match label_lists.get(last_arg) {
            Some(named) => named.clone(),
            None => {
                let Some(labels) = part.split("&[").nth(1).and_then(|l| l.split(']').next()) else {
                    continue;
                };
                quoted(labels)
            }
        };
        // The owner: `field: counter(` or `pub static NAME:` before this occurrence.
        let before = &metrics_rs[..metrics_rs.find(&format!("\"{family}\"")).unwrap()];
        let owner = before
            .rsplit('\n')
            .find_map(|line| {
                let line = line.trim();
                if let Some(rest) = line.strip_prefix("pub static ") {
                    return Some(rest.split(':').next().unwrap().to_owned());
                }
                let field = line.split(':').next().unwrap();
                // `field: r.counter(` or `field: r.cost(` in `Metrics::new`.
                (line.contains(": r.counter(") || line.contains(": r.cost(")).then(|| field.trim().to_owned())
            })
            .unwrap();
        families.insert(owner, (family, labels));
    }
    assert!(families.len() >= 20, "{families:?}");
    // Call sites with their argument lists.
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            // Method chains joined onto one line (`.queue_oldest_age_seconds` then, below it,
            // `.with_label_values(…)`).
            let src = std::fs::read_to_string(&path).unwrap().lines().fold(String::new(), |mut out, line| {
                if !line.trim_start().starts_with('.') {
                    out.push('\n');
                }
                out.push_str(line.trim_start());
                out
            });
            for (owner, (family, labels)) in &families {
                for part in src.split(&format!("{owner}.with_label_values(&[")).skip(1) {
                    let args: Vec<&str> = part.split(']').next().unwrap().split(',').map(str::trim).collect();
                    if args.len() != labels.len() {
                        continue;
                    }
                    let values: Vec<String> = args
                        .iter()
                        .map(|a| {
                            a.strip_prefix('"').and_then(|a| a.strip_suffix('"')).unwrap_or("*").to_owned()
                        })
                        .collect();
                    let pairs: Vec<(&str, &str)> =
                        labels.iter().map(String::as_str).zip(values.iter().map(String::as_str)).collect();
                    let dims =
                        labels.iter().filter(|l| EMF_DIMENSIONS.contains(&l.as_str())).cloned().collect();
                    out.insert(emf_name(family, &pairs), dims);
                }
            }
        }
    }
    let lambda_rs: String = ["startup.rs", "handlers.rs", "batch.rs"]
        .map(|f| std::fs::read_to_string(root.join("lambda").join(f)).unwrap())
        .concat();
    for part in lambda_rs.split("{\"Name\": \"").skip(1) {
        out.insert(part.split('"').next().unwrap().to_owned(), BTreeSet::from(["lane".to_owned()]));
    }
    out
}

/// Whether `name` with `dims` is something the code emits (a `*` in an emitted name matches any
/// label value).
fn is_emitted(emitted: &BTreeMap<String, BTreeSet<String>>, name: &str, dims: &BTreeSet<String>) -> bool {
    emitted.iter().any(|(pattern, d)| {
        let matches = match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head) && name.ends_with(tail) && name.len() > head.len() + tail.len()
            }
        };
        matches && d == dims
    })
}

/// Every metric of the stack's own namespace that an alarm or a dashboard widget names is one the
/// code emits, with the dimensions it is emitted with: a chart of a metric nobody emits stays empty
/// and an alarm on one never fires.
#[test]
fn alarms_and_dashboard_name_only_emitted_metrics() {
    let emitted = emitted_metrics();
    for name in [
        "llm_tokens_prompt",
        "duplicates_commit_cache",
        "handed_back",
        "dead_lettered",
        "queue_depth",
        "queue_oldest_age_seconds",
    ] {
        assert!(emitted.contains_key(name), "{name} not found in the code: {emitted:?}");
    }
    let t = template();
    let ours = |ns: &Value| format!("{ns:?}").contains("Lanes/${AWS::StackName}");
    let mut named: Vec<(String, BTreeSet<String>, String)> = Vec::new();
    for (id, r) in resources(&t) {
        if r["Type"] == "AWS::CloudWatch::Alarm" && ours(&r["Properties"]["Namespace"]) {
            let dims = r["Properties"]["Dimensions"]
                .as_sequence()
                .map(|d| d.iter().map(|d| d["Name"].as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            named.push((r["Properties"]["MetricName"].as_str().unwrap().to_owned(), dims, id));
        }
    }
    let Value::Tagged(body) = &resources(&t)["Dashboard"]["Properties"]["DashboardBody"] else { panic!() };
    let mut text = body.value.as_str().unwrap().to_owned();
    while let Some(start) = text.find("${") {
        let end = start + text[start..].find('}').unwrap();
        text.replace_range(start..=end, "X");
    }
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    for widget in dashboard["widgets"].as_array().unwrap() {
        let title = widget["properties"]["title"].as_str().unwrap_or("").to_owned();
        let mut previous: Option<(String, BTreeSet<String>)> = None;
        for line in widget["properties"]["metrics"].as_array().into_iter().flatten() {
            let items = line.as_array().unwrap();
            if let Some(expr) = items[0]["expression"].as_str() {
                // SEARCH('{Lanes/X,lane,reason} MetricName="handed_back"', …)
                let Some(schema) = expr.split('{').nth(1).and_then(|s| s.split('}').next()) else { continue };
                let mut parts = schema.split(',');
                if parts.next() != Some("Lanes/X") {
                    continue;
                }
                let dims = parts.map(str::to_owned).collect();
                let name = expr.split("MetricName=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
                named.push((name, dims, title.clone()));
                continue;
            }
            let strings: Vec<&str> = items.iter().filter_map(|v| v.as_str()).collect();
            let entry = if strings.first() == Some(&"...") {
                previous.clone()
            } else if strings.first() == Some(&"Lanes/X") {
                let dims = strings[2..].iter().step_by(2).map(|d| (*d).to_owned()).collect();
                Some((strings[1].to_owned(), dims))
            } else {
                None
            };
            previous = entry.clone();
            if let Some((name, dims)) = entry {
                named.push((name, dims, title.clone()));
            }
        }
    }
    assert!(named.len() >= 8, "{named:?}");
    for (name, dims, place) in &named {
        assert!(
            is_emitted(&emitted, name, dims),
            "{place}: {name} with dimensions {dims:?} is never emitted"
        );
    }
}

/// The KMS key a `KmsMasterKeyId` names, if the template makes it (None for a string: an alias or
/// an ARN from outside).
fn template_key(r: &BTreeMap<String, Value>, id: &Value) -> Option<Value> {
    match id {
        Value::Tagged(_) => {
            let key = &r[&target(id)];
            assert_eq!(key["Type"], "AWS::KMS::Key", "the topic's key is a KMS key");
            Some(key.clone())
        }
        _ => None,
    }
}

/// Whether a key policy lets `service` run every one of `actions` (a `kms:X*` grant covers `kms:X...`).
fn key_grants(key: &Value, service: &str, actions: &[&str]) -> bool {
    let statements = key["Properties"]["KeyPolicy"]["Statement"].as_sequence().unwrap();
    actions.iter().all(|want| {
        statements.iter().any(|s| {
            let granted: Vec<&str> = match &s["Action"] {
                Value::Sequence(a) => a.iter().filter_map(|a| a.as_str()).collect(),
                a => a.as_str().into_iter().collect(),
            };
            s["Effect"] == "Allow"
                && s["Principal"]["Service"] == service
                && granted
                    .iter()
                    .any(|g| g == want || g.strip_suffix('*').is_some_and(|p| want.starts_with(p)))
        })
    })
}

/// CloudWatch can publish an alarm to an SNS topic encrypted with a KMS key only when the key's
/// policy grants `cloudwatch.amazonaws.com` `kms:GenerateDataKey*` and `kms:Decrypt`; the
/// AWS-managed `alias/aws/sns` key's policy cannot be changed and grants neither, so alarms to such
/// a topic are dropped. Every alarm notifies the topic, and `AlarmEmail` subscribes an address.
#[test]
fn alarms_can_notify() {
    let t = template();
    let r = resources(&t);
    let topics: Vec<&String> = r.keys().filter(|k| r[*k]["Type"] == "AWS::SNS::Topic").collect();
    assert_eq!(topics, ["AlarmTopic"]);
    let topic = &r["AlarmTopic"]["Properties"];
    if let Some(id) = topic.get("KmsMasterKeyId") {
        let text = format!("{id:?}");
        assert!(
            !text.contains("alias/aws/"),
            "an AWS-managed key: CloudWatch cannot publish with it ({text})"
        );
        let key =
            template_key(&r, id).expect("the topic's key is made here, with a policy CloudWatch may use");
        assert!(key["Condition"].is_null(), "the key exists whenever the topic does");
        assert!(
            key_grants(&key, "cloudwatch.amazonaws.com", &["kms:Decrypt", "kms:GenerateDataKey"]),
            "the key policy lets CloudWatch encrypt for the topic"
        );
        assert_eq!(key["Properties"]["EnableKeyRotation"], true);
    }
    for (name, alarm) in r.iter().filter(|(_, a)| a["Type"] == "AWS::CloudWatch::Alarm") {
        let actions = alarm["Properties"]["AlarmActions"].as_sequence().unwrap();
        assert!(actions.iter().any(|a| target(a) == "AlarmTopic"), "{name} notifies the alarm topic");
    }
    let email = &t["Parameters"]["AlarmEmail"];
    assert_eq!(email["Default"], "", "no subscription unless asked");
    let subscription = &r["AlarmEmailSubscription"];
    assert_eq!(subscription["Type"], "AWS::SNS::Subscription");
    assert_eq!(subscription["Properties"]["Protocol"], "email");
    assert_eq!(target(&subscription["Properties"]["Endpoint"]), "AlarmEmail");
    assert_eq!(target(&subscription["Properties"]["TopicArn"]), "AlarmTopic");
    let condition = subscription["Condition"].as_str().unwrap();
    assert!(
        format!("{:?}", t["Conditions"][condition]).contains("AlarmEmail"),
        "made when AlarmEmail is set"
    );
}

/// The default of the parameter `value` refers to, after checking it is a parameter.
fn parameter_default(t: &Value, value: &Value) -> u64 {
    let name = target(value);
    num(&t["Parameters"][name.as_str()]["Default"])
}

/// Nothing public reaches Lambda unthrottled (security review M2): the webhook's function URL has
/// reserved concurrency (so a flood is refused there and cannot take the workers' concurrency), and
/// the HTTP API throttles its default route; each is a parameter with a default, in the README.
#[test]
fn the_public_entry_points_are_throttled() {
    let t = template();
    let r = resources(&t);
    let webhook = &r["WebhookFunction"]["Properties"];
    let reserved = parameter_default(&t, &webhook["ReservedConcurrentExecutions"]);
    assert!((1..=100).contains(&reserved), "webhook reserved concurrency {reserved}");
    let stage = &r["ApiStage"]["Properties"]["DefaultRouteSettings"];
    let rate = parameter_default(&t, &stage["ThrottlingRateLimit"]);
    let burst = parameter_default(&t, &stage["ThrottlingBurstLimit"]);
    assert!(rate >= 1 && burst >= rate, "API throttling rate {rate}, burst {burst}");
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    for p in ["WebhookReservedConcurrency", "ApiThrottleRate", "ApiThrottleBurst", "AlarmEmail"] {
        assert!(readme.contains(&format!("`{p}`")), "README documents {p}");
    }
}

/// The ingress function serves the longest long-poll whole: its `Timeout` holds `wait`'s maximum,
/// the margin the long-poll keeps before the deadline and the one the request cut-off keeps, and
/// stays within the HTTP API's 30 s integration limit. (A shorter one still answers in time, with
/// the wait cut: `lambda_limits`.)
#[test]
fn the_ingress_timeout_holds_the_longest_long_poll() {
    use lanes_core::lambda::deadline::ANSWER_MARGIN;
    use lanes_core::tasks::poll::{LONG_POLL_MARGIN, MAX_WAIT_SECS};
    let t = template();
    let ingress = &resources(&t)["IngressFunction"];
    let timeout = std::time::Duration::from_secs(timeout(&t, ingress));
    let needed = std::time::Duration::from_secs(MAX_WAIT_SECS) + LONG_POLL_MARGIN + ANSWER_MARGIN;
    assert!(timeout >= needed, "ingress Timeout {timeout:?} < {needed:?}");
    assert!(timeout <= std::time::Duration::from_secs(30), "past the HTTP API's 30 s: {timeout:?}");
}

/// The results bucket: private (every public access blocked, ACLs off), encrypted, reachable over
/// TLS only, from the VPC through a gateway endpoint, and its objects outlive the records that name
/// them (the record TTL) by at most a couple of days.
#[test]
fn the_results_bucket_is_private_encrypted_and_expires_with_the_records() {
    let t = template();
    let r = resources(&t);
    let bucket = &r["ResultsBucket"]["Properties"];
    let sse =
        &bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"];
    assert!(!sse["SSEAlgorithm"].is_null());
    for k in ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"] {
        assert_eq!(bucket["PublicAccessBlockConfiguration"][k], true, "{k}");
    }
    let rule = &bucket["LifecycleConfiguration"]["Rules"][0];
    assert_eq!((rule["Status"].as_str(), rule["Prefix"].as_str()), (Some("Enabled"), Some("results/")));
    let ttl_days = lanes_core::config::WorkerConfig::default().record_ttl_secs.div_ceil(86_400);
    let days = num(&rule["ExpirationInDays"]);
    assert!(
        (ttl_days..=ttl_days + 2).contains(&days),
        "objects expire after {days} days, records after {ttl_days}"
    );
    let policy = format!("{:?}", r["ResultsBucketPolicy"]["Properties"]["PolicyDocument"]);
    assert!(policy.contains("aws:SecureTransport") && policy.contains("Deny"), "TLS only: {policy}");
    let endpoint = &r["S3Endpoint"]["Properties"];
    assert_eq!(endpoint["VpcEndpointType"], "Gateway");
    assert!(format!("{:?}", endpoint["ServiceName"]).contains(".s3"));
    assert_eq!(
        target(&t["Globals"]["Function"]["Environment"]["Variables"]["LANES_RESULTS_BUCKET"]),
        "ResultsBucket"
    );
}

/// Each function writes only its own kinds of item (security review L2): every statement that
/// grants a DynamoDB write names the leading keys it may touch (`task#`, `commit#`, `delivery#`,
/// `pushed#`), the internet-facing webhook touches no task, and ingress cannot send to the commits
/// lane (commits come from the webhook only).
#[test]
fn writes_are_scoped_to_each_functions_own_items() {
    let t = template();
    for (id, f) in functions(&t) {
        for policy in f["Properties"]["Policies"].as_sequence().unwrap() {
            for s in policy["Statement"].as_sequence().unwrap() {
                let actions = format!("{:?}", s["Action"]);
                let writes = ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"];
                if !writes.iter().any(|w| actions.contains(w)) {
                    continue;
                }
                let keys = &s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"];
                let keys: Vec<&str> = keys
                    .as_sequence()
                    .map(|k| k.iter().filter_map(|k| k.as_str()).collect())
                    .unwrap_or_default();
                assert!(!keys.is_empty(), "{id}: DynamoDB writes without a LeadingKeys condition");
                assert!(keys.iter().all(|k| k.ends_with("#*")), "{id}: {keys:?}");
                if id == "WebhookFunction" {
                    assert!(!keys.contains(&"task#*") && !keys.contains(&"commit#*"), "{id}: {keys:?}");
                }
            }
        }
    }
    let sends = format!("{:?}", allowed(&functions(&t)["IngressFunction"])["sqs:SendMessage"]);
    assert!(!sends.contains("CommitsQueue"), "ingress may send to the commits lane: {sends}");
}
