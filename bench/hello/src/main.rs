//! `hello`: the smallest `lambda_runtime` function, built with the functions' release profile. `lanes
//! bench coldstart` measures its init as the floor the real functions are compared with.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(
        |event: LambdaEvent<Value>| async move { Ok::<Value, Error>(event.payload) },
    ))
    .await
}
