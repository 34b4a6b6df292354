//! A declared resource's record (`schemas/declared-resource.avsc`): its id and its
//! JSON document, which the owning service validates and reads.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "DeclaredResource")]
pub struct DeclaredResource {
    pub id: String,
    pub document: String,
}
