//! [`ResultObjects`] on S3: one object per key in the results bucket, written with the bucket's
//! default encryption and expired by its lifecycle rule (the template sets both).

use crate::ports::{ResultObjects, StoreError};
use async_trait::async_trait;
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;

/// The results bucket.
#[derive(Clone, Debug)]
pub struct S3Objects {
    client: aws_sdk_s3::Client,
    bucket: String,
}

impl S3Objects {
    /// Objects in `bucket`.
    pub fn new(client: aws_sdk_s3::Client, bucket: &str) -> Self {
        Self { client, bucket: bucket.to_owned() }
    }

    /// Creates `bucket` (local runs against an emulator), idempotently.
    pub async fn create_bucket(client: &aws_sdk_s3::Client, bucket: &str) -> Result<(), StoreError> {
        match client.create_bucket().bucket(bucket).send().await {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()) =>
            {
                Ok(())
            }
            Err(e) => Err(StoreError::Unavailable(format!("create bucket {bucket}: {}", describe(&e)))),
        }
    }
}

fn describe<E: std::error::Error + 'static, R>(e: &SdkError<E, R>) -> String {
    match e {
        SdkError::ServiceError(s) => s.err().to_string(),
        other => other.to_string(),
    }
}

#[async_trait]
impl ResultObjects for S3Objects {
    async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| StoreError::Unavailable(format!("s3 put {key}: {}", describe(&e))))
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(out) => out
                .body
                .collect()
                .await
                .map(|b| Some(b.into_bytes().to_vec()))
                .map_err(|e| StoreError::Unavailable(format!("s3 read {key}: {e}"))),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
            Err(e) => Err(StoreError::Unavailable(format!("s3 get {key}: {}", describe(&e)))),
        }
    }
}
