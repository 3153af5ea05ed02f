//! The concurrency controller against moto: the Lambda adapter reads and updates a real (emulated)
//! event source mapping's `ScalingConfig.MaximumConcurrency`, and a tick over real SQS depths sets
//! each lane's mapping from the pool policy. The function and its mappings are created with boto3
//! from the test venv (the fixture only; the code under test is the Rust adapter).

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::lambda::LambdaMappings;
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::SqsQueue;
use lanes_core::controller::Controller;
use lanes_core::embedded::QueueSettings;
use lanes_core::ports::MappingControl;
use lanes_core::ports::{QueueConsume, QueueSend};
use lanes_core::wiring::create_aws_resources;
use lanes_tests::{MotoServer, venv_bin};
use std::process::Command;
use std::sync::Arc;

/// Creates a worker function and one SQS mapping per queue ARN in moto; returns the mapping UUIDs.
/// The mappings are disabled: moto would otherwise consume the queues itself.
fn create_mappings(moto: &MotoServer, queue_arns: &[String]) -> Vec<String> {
    let script = r##"
import io, json, sys, zipfile, boto3
endpoint, arns = sys.argv[1], json.loads(sys.argv[2])
kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
iam, lam = boto3.client("iam", **kw), boto3.client("lambda", **kw)
role = iam.create_role(RoleName="worker", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    z.writestr("bootstrap", "#!/bin/sh\n")
lam.create_function(FunctionName="worker", Runtime="provided.al2023", Handler="bootstrap", Role=role["Role"]["Arn"],
    Code={"ZipFile": buf.getvalue()}, Architectures=["arm64"])
out = [lam.create_event_source_mapping(FunctionName="worker", EventSourceArn=a, BatchSize=10,
    FunctionResponseTypes=["ReportBatchItemFailures"], ScalingConfig={"MaximumConcurrency": 5},
    Enabled=False)["UUID"] for a in arns]
print(json.dumps(out))
"##;
    let out = Command::new(venv_bin("python"))
        .args(["-c", script, &moto.endpoint(), &serde_json::to_string(queue_arns).unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "fixture: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn controller_sets_each_lanes_mapping_on_moto() {
    let moto = MotoServer::start();
    let settings = moto.aws_settings();
    let urls = create_aws_resources(&settings, "ctl", "lanes-ctl", QueueSettings::default()).await.unwrap();
    let sdk = sdk_config(&settings).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let mut arns = Vec::new();
    for url in &urls {
        let attrs = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap();
        arns.push(attrs.attributes().unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn].clone());
    }
    let uuids = create_mappings(&moto, &arns);
    assert_eq!(uuids.len(), 3);

    let mappings = LambdaMappings::new(aws_sdk_lambda::Client::new(&sdk));
    assert_eq!(mappings.max_concurrency(&uuids[0]).await.unwrap(), Some(5));
    mappings.set_max_concurrency(&uuids[0], 7).await.unwrap();
    assert_eq!(mappings.max_concurrency(&uuids[0]).await.unwrap(), Some(7));
    let missing = mappings.max_concurrency("00000000-0000-0000-0000-000000000000").await.unwrap_err();
    assert!(missing.to_string().contains("ResourceNotFound"), "{missing}");

    // Synthesis has a backlog, the others are idle: synthesis borrows, the others sit at Lambda's minimum.
    let queues: Vec<SqsQueue> = urls.iter().map(|u| SqsQueue::sender(sqs.clone(), u)).collect();
    for i in 0..25 {
        queues[1].send(&format!("s{i}"), Default::default()).await.unwrap();
    }
    let controller = Controller::new(
        queues
            .iter()
            .map(|q| Arc::new(q.clone()) as Arc<dyn QueueConsume>)
            .collect::<Vec<_>>()
            .try_into()
            .ok()
            .unwrap(),
        uuids.clone().try_into().unwrap(),
        Arc::new(mappings.clone()),
        30,
    );
    let decisions = controller.tick().await;
    assert!(decisions.iter().all(|d| d.error.is_none()), "{decisions:?}");
    assert_eq!(decisions.iter().map(|d| d.target).collect::<Vec<_>>(), [2, 25, 2], "{decisions:?}");
    for (uuid, want) in uuids.iter().zip([2, 25, 2]) {
        assert_eq!(mappings.max_concurrency(uuid).await.unwrap(), Some(want));
    }
    let again = controller.tick().await;
    assert!(again.iter().all(|d| !d.changed), "unchanged depths, no update: {again:?}");
}
