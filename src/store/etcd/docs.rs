//! Timers and callbacks on etcd (`tm/<id>`, `cb/<id>`): the [`Docs`] and [`DocTxn`]
//! implementations. Each write compares the revision its transaction read, or that the key is
//! new; a timer's write is fenced like a waitpoint's, a callback's is not.

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, TxnOp};

use crate::error::Result;
use crate::store::etcd::Etcd;
use crate::store::etcd::client::to_json;
use crate::store::etcd::fence::Proof;
use crate::store::{Doc, DocTxn, Docs};

impl Etcd {
    /// One record of a kind with its key's revision; one that does not parse is set aside.
    fn read_doc<T: Doc>(&self, id: &str) -> Result<Option<(T, i64)>> {
        if !T::KIND.is_id(id) {
            return Ok(None);
        }
        let key = self.keys.doc(T::KIND, id);
        match self.get_value(key.clone())? {
            None => Ok(None),
            Some((v, rev)) => match serde_json::from_slice(&v) {
                Ok(t) => Ok(Some((t, rev))),
                Err(e) => {
                    self.set_aside(&key, &v, &e.to_string())?;
                    Ok(None)
                }
            },
        }
    }
}

impl<T: Doc> Docs<T> for Etcd {
    fn get_doc(&self, id: &str) -> Result<Option<T>> {
        Ok(self.read_doc(id)?.map(|(t, _)| t))
    }

    fn all_docs(&self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for (k, v) in self.range(&self.keys.docs(T::KIND), false, 0)? {
            match serde_json::from_slice::<T>(&v) {
                Ok(t) => out.push(t),
                Err(e) => self.set_aside(&k, &v, &e.to_string())?,
            }
        }
        Ok(out)
    }

    fn begin_docs(&self) -> Result<Box<dyn DocTxn<T> + '_>> {
        Ok(Box::new(EtcdDocs::new(self)))
    }
}

/// Timers or callbacks: each write compares the revision read (or that the key is new, which
/// also records the session's host, where its wakes go). A timer's write is fenced like a
/// waitpoint's; a callback's is not ([`DocKind::fenced`](crate::store::DocKind::fenced)).
struct EtcdDocs<'a, T> {
    store: &'a Etcd,
    read: HashMap<String, i64>,
    kind: std::marker::PhantomData<T>,
}

impl<'a, T> EtcdDocs<'a, T> {
    fn new(store: &'a Etcd) -> Self {
        EtcdDocs {
            store,
            read: HashMap::new(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<T: Doc> DocTxn<T> for EtcdDocs<'_, T> {
    fn read(&mut self, id: &str) -> Result<Option<T>> {
        Ok(self.store.read_doc::<T>(id)?.map(|(t, rev)| {
            self.read.insert(id.to_owned(), rev);
            t
        }))
    }

    fn put(&mut self, doc: &T) -> Result<()> {
        self.put_all(std::slice::from_ref(doc))
    }

    /// Every document's write and its check in one etcd transaction.
    fn put_all(&mut self, docs: &[T]) -> Result<()> {
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut channels = std::collections::HashSet::new();
        // Each document as this transaction writes it (see `Proof`).
        let mut proof = Proof::default();
        for doc in docs {
            let key = self.store.keys.doc(T::KIND, doc.id());
            proof.value(key.clone(), to_json(doc));
            ops.push(TxnOp::put(key.clone(), to_json(doc), None));
            compares.push(match self.read.get(doc.id()) {
                Some(rev) => Compare::mod_revision(key, CompareOp::Equal, *rev),
                None => {
                    // One put per key: etcd refuses a transaction naming a key twice.
                    if channels.insert(doc.session().to_owned()) {
                        ops.push(TxnOp::put(
                            self.store.keys.channel(doc.session()),
                            self.store.host.as_bytes().to_vec(),
                            None,
                        ));
                    }
                    Compare::version(key, CompareOp::Equal, 0)
                }
            });
        }
        let what = "cannot write a timer or callback";
        let rev = self
            .store
            .commit(what, compares, ops, T::KIND.fenced(), &proof)?;
        for doc in docs {
            self.read.insert(doc.id().to_owned(), rev);
        }
        Ok(())
    }
}
