//! Tables on an S3-compatible object store (`s3://bucket/prefix`), read through
//! the object_store crate. Credentials and endpoint come from the usual AWS
//! variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT` for MinIO / Ceph / other S3-compatible stores, `AWS_ALLOW_HTTP`).
//! The scan runs on a blocking thread; each call waits on the runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;

use super::formats::{ScanError, Tree};

pub struct ObjectTree {
    store: Arc<dyn ObjectStore>,
    root: Key,
    url: String,
    runtime: tokio::runtime::Handle,
}

/// The store and the prefix `s3://bucket/prefix` (or `s3a://`) names: the
/// bucket as object_store reads it from the URL, the prefix from the URL's path.
pub fn locate(url: &str) -> Result<(AmazonS3Builder, Key), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
    if !matches!(parsed.scheme(), "s3" | "s3a") {
        return Err(format!("{url:?} is not an s3:// URL"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{url:?} names no bucket"));
    }
    let prefix = Key::from_url_path(parsed.path()).map_err(|e| format!("{url:?}: {e}"))?;
    // object_store takes the bucket from the host; `s3a` is Hadoop's name for s3.
    let s3 = format!("s3://{}", parsed.host_str().unwrap_or_default());
    Ok((AmazonS3Builder::from_env().with_url(s3), prefix))
}

impl ObjectTree {
    pub fn open(url: &str, runtime: tokio::runtime::Handle) -> Result<ObjectTree, String> {
        let (builder, root) = locate(url)?;
        let store = builder.build().map_err(|e| format!("{url}: {e}"))?;
        Ok(ObjectTree {
            store: Arc::new(store),
            root,
            url: url.trim_end_matches('/').to_owned(),
            runtime,
        })
    }

    fn key(&self, rel: &Path) -> Key {
        rel.components()
            .filter_map(|c| c.as_os_str().to_str())
            .fold(self.root.clone(), |k, part| k.child(part))
    }

    fn io(&self, rel: &Path, e: &object_store::Error) -> ScanError {
        let kind = if matches!(e, object_store::Error::NotFound { .. }) {
            std::io::ErrorKind::NotFound
        } else {
            std::io::ErrorKind::Other
        };
        ScanError::Io {
            path: self.full(rel),
            error: std::io::Error::new(kind, e.to_string()),
        }
    }
}

impl Tree for ObjectTree {
    fn list(&self, dir: &Path) -> Result<Vec<String>, ScanError> {
        let prefix = self.key(dir);
        let listed = self
            .runtime
            .block_on(self.store.list_with_delimiter(Some(&prefix)))
            .map_err(|e| self.io(dir, &e))?;
        let names: Vec<String> = listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_owned))
            .chain(
                listed
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(str::to_owned)),
            )
            .collect();
        if names.is_empty() {
            // Object stores have no empty directories: nothing under it = not there.
            return Err(ScanError::NoTable(self.full(dir)));
        }
        Ok(names)
    }

    fn read(&self, path: &Path) -> Result<Vec<u8>, ScanError> {
        let key = self.key(path);
        self.runtime
            .block_on(async {
                let got = self.store.get(&key).await?;
                got.bytes().await
            })
            .map(|b| b.to_vec())
            .map_err(|e| self.io(path, &e))
    }

    fn mtime_ms(&self, path: &Path) -> i64 {
        self.runtime
            .block_on(self.store.head(&self.key(path)))
            .map_or(0, |m| m.last_modified.timestamp_millis())
    }

    fn exists(&self, path: &Path) -> bool {
        self.runtime
            .block_on(self.store.head(&self.key(path)))
            .is_ok()
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.list(path).is_ok()
    }

    fn full(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("{}/{}", self.url, path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let (builder, prefix) = locate("s3://lake/warehouse/ods.db/t/").expect("s3");
        assert_eq!(prefix.as_ref(), "warehouse/ods.db/t");
        let store = builder.with_region("us-east-1").build().expect("store");
        assert!(store.to_string().contains("lake"), "{store}");
        let (_, prefix) = locate("s3a://lake").expect("s3a");
        assert_eq!(prefix.as_ref(), "");
        assert!(locate("gs://lake/x").is_err());
        assert!(locate("s3:///x").is_err());
    }
}
