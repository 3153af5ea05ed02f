//! Each port's contract (`lanes_tests::contract`) against each of its implementations: the embedded
//! twin, and the AWS adapter on a real `moto_server`.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::dynamodb::{DynamoStore, DynamoSummaries};
use lanes_core::adapters::redis::{RedisCache, RedisLock, connect};
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::{SqsQueue, create_queue_with_dlq};
use lanes_core::clock::SystemClock;
use lanes_core::embedded::{
    EmbeddedAdmission, EmbeddedDb, EmbeddedQueues, EmbeddedStore, EmbeddedSummaries, MemoryCache, MemoryLock,
    QueueSettings,
};
use lanes_core::ports::{Admission, PutThenSend, QueueSend};
use lanes_tests::{MotoServer, RedisServer, contract, now_ms};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn task_store_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
    contract::task_store(&store, now_ms()).await;
    contract::task_transitions(&store, now_ms()).await;
    contract::task_checkpoints(&store, now_ms()).await;
}

#[tokio::test]
async fn task_store_dynamodb() {
    let moto = MotoServer::start();
    let client = aws_sdk_dynamodb::Client::new(&sdk_config(&moto.aws_settings()).await);
    DynamoStore::create_table(&client, "contract").await.unwrap();
    let store = DynamoStore::new(client, "contract");
    contract::task_store(&store, now_ms()).await;
    contract::task_transitions(&store, now_ms()).await;
    contract::task_checkpoints(&store, now_ms()).await;
}

#[tokio::test]
async fn queue_requeue_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let settings = QueueSettings {
        default_visibility: Duration::from_secs(900),
        max_receive_count: 10,
        ..Default::default()
    };
    let queues = EmbeddedQueues::open(EmbeddedDb::open(dir.path()).unwrap(), Arc::new(SystemClock), settings)
        .await
        .unwrap();
    contract::queue_requeue(&queues.queue("interactive", "interactive-dlq")).await;
}

#[tokio::test]
async fn queue_requeue_sqs() {
    let moto = MotoServer::start();
    let client = aws_sdk_sqs::Client::new(&sdk_config(&moto.aws_settings()).await);
    let url = create_queue_with_dlq(&client, "contract", Duration::from_secs(900), 10).await.unwrap();
    contract::queue_requeue(&SqsQueue::connect(client, &url).await.unwrap()).await;
}

#[tokio::test]
async fn queue_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let settings = QueueSettings {
        default_visibility: Duration::from_secs(900),
        max_receive_count: 10,
        ..Default::default()
    };
    let queues = EmbeddedQueues::open(EmbeddedDb::open(dir.path()).unwrap(), Arc::new(SystemClock), settings)
        .await
        .unwrap();
    let queue = queues.queue("interactive", "interactive-dlq");
    contract::queue(&queue, &queue.dead_letter_queue()).await;
}

#[tokio::test]
async fn queue_sqs() {
    let moto = MotoServer::start();
    let client = aws_sdk_sqs::Client::new(&sdk_config(&moto.aws_settings()).await);
    let url = create_queue_with_dlq(&client, "contract", Duration::from_secs(900), 10).await.unwrap();
    let queue = SqsQueue::connect(client, &url).await.unwrap();
    contract::queue(&queue, &queue.dead_letter_queue().unwrap()).await;
}

#[tokio::test]
async fn lease_lock_and_cache_in_process() {
    contract::lease_lock(&MemoryLock::new(Arc::new(SystemClock))).await;
    contract::cache(&MemoryCache::new(Arc::new(SystemClock))).await;
    contract::event_log(&lanes_core::embedded::MemoryEvents::new(Arc::new(SystemClock))).await;
}

#[tokio::test]
async fn lease_lock_and_cache_on_redis_server() {
    lock_and_cache_contracts(RedisServer::start()).await;
}

#[tokio::test]
async fn lease_lock_and_cache_on_a_tls_redis_server() {
    lock_and_cache_contracts(RedisServer::start_tls()).await;
}

/// Cluster mode, what the template deploys (ElastiCache Serverless).
#[tokio::test]
async fn lease_lock_and_cache_on_a_redis_cluster() {
    lock_and_cache_contracts_in(RedisServer::start_cluster(), true).await;
}

async fn lock_and_cache_contracts(redis: RedisServer) {
    lock_and_cache_contracts_in(redis, false).await;
}

async fn lock_and_cache_contracts_in(redis: RedisServer, cluster: bool) {
    let settings = redis.settings(cluster);
    let conn = connect(&settings).await.unwrap();
    contract::lease_lock(&RedisLock::new(conn.clone(), "lanes:")).await;
    contract::cache(&RedisCache::new(conn.clone(), "lanes:")).await;
    contract::event_log(&lanes_core::adapters::redis::events::RedisEvents::new(conn, "lanes:")).await;
}

#[tokio::test]
async fn summary_store_embedded() {
    let dir = tempfile::tempdir().unwrap();
    contract::summary_store(&EmbeddedSummaries::new(EmbeddedDb::open(dir.path()).unwrap())).await;
}

#[tokio::test]
async fn batch_store_embedded() {
    let dir = tempfile::tempdir().unwrap();
    contract::batch_store(&lanes_core::embedded::EmbeddedBatches::new(EmbeddedDb::open(dir.path()).unwrap()))
        .await;
}

#[tokio::test]
async fn batch_store_dynamodb() {
    let moto = MotoServer::start();
    let client = aws_sdk_dynamodb::Client::new(&sdk_config(&moto.aws_settings()).await);
    DynamoStore::create_table(&client, "contract").await.unwrap();
    contract::batch_store(&lanes_core::adapters::dynamodb::DynamoBatches::new(client, "contract")).await;
}

#[tokio::test]
async fn summary_store_dynamodb() {
    let moto = MotoServer::start();
    let client = aws_sdk_dynamodb::Client::new(&sdk_config(&moto.aws_settings()).await);
    DynamoStore::create_table(&client, "contract").await.unwrap();
    contract::summary_store(&DynamoSummaries::new(client, "contract")).await;
}

#[tokio::test]
async fn result_objects_in_files() {
    let dir = tempfile::tempdir().unwrap();
    contract::result_objects(&lanes_core::embedded::FileObjects::new(dir.path())).await;
}

#[tokio::test]
async fn result_objects_on_moto_s3() {
    let moto = MotoServer::start();
    let aws = lanes_core::adapters::AwsClients::load(&moto.aws_settings()).await;
    aws.create_bucket("lanes-results").await.unwrap();
    aws.create_bucket("lanes-results").await.unwrap(); // idempotent
    contract::result_objects(&aws.result_objects("lanes-results")).await;
}

/// The embedded admission (one write) and the two-request one it stands in for, on the same store
/// and queues.
#[tokio::test]
async fn admission_embedded() {
    for one_write in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let queues = EmbeddedQueues::open(db, Arc::new(SystemClock), QueueSettings::default()).await.unwrap();
        let lanes = ["interactive", "synthesis", "commits"].map(|l| queues.queue(l, &format!("{l}-dlq")));
        let admission: Arc<dyn Admission> = if one_write {
            Arc::new(EmbeddedAdmission::new(store.clone(), lanes.clone()))
        } else {
            let send = lanes.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>);
            Arc::new(PutThenSend::new(Arc::new(store.clone()), send))
        };
        contract::admission(&*admission, &store, &lanes[0], now_ms()).await;
    }
}

#[tokio::test]
async fn admission_dynamodb_and_sqs() {
    let moto = MotoServer::start();
    let config = sdk_config(&moto.aws_settings()).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&config);
    DynamoStore::create_table(&dynamo, "contract").await.unwrap();
    let store = Arc::new(DynamoStore::new(dynamo, "contract"));
    let sqs = aws_sdk_sqs::Client::new(&config);
    let url = create_queue_with_dlq(&sqs, "contract", Duration::from_secs(900), 10).await.unwrap();
    let queue = Arc::new(SqsQueue::connect(sqs, &url).await.unwrap());
    let send = [(); 3].map(|()| queue.clone() as Arc<dyn QueueSend>);
    contract::admission(&PutThenSend::new(store.clone(), send), &*store, &*queue, now_ms()).await;
}
