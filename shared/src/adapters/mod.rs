//! Production adapters of the ports: SQS, DynamoDB, and Redis/Valkey (ElastiCache). Only this module
//! touches an SDK; each adapter has an embedded twin in `crate::embedded`.

pub mod dynamodb;
pub mod redis;
pub mod sqs;
