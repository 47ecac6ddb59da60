//! The children a flow owns, found by owner reference: a child is the flow's only when the flow
//! (by uid) controls it, so neither an apply nor a removal ever touches an object of the same
//! name that belongs to someone else.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DeleteParams;
use kube::{Api, Resource, ResourceExt};

use super::{Error, desired, guards};
use crate::api::MirrorFlow;
use crate::status::Blocked;

pub async fn delete_owned<K>(
    client: &kube::Client,
    ns: &str,
    name: &str,
    owner_uid: &str,
) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let owned = owners_of::<K>(client, ns, name)
        .await?
        .is_some_and(|owners| owners.iter().any(|r| r.uid == owner_uid));
    if owned {
        Api::<K>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::background())
            .await?;
    }
    Ok(())
}

/// A child's name taken by an object this flow does not control. Server-side apply with
/// `force` would take it over (a Service's selector and a PDB's are replaced whole) and a later
/// removal would delete it: a flow author could seize or delete objects they may not write.
/// So each name is looked up first, and a foreign object stops the apply before anything is
/// written.
pub async fn foreign_child(
    client: &kube::Client,
    ns: &str,
    mf: &MirrorFlow,
    network_policy: bool,
) -> Result<Option<Blocked>, Error> {
    let uid = uid_of(mf);
    let name = mf.name_any();
    let mut checks = vec![
        ("ConfigMap", desired::config_map_name(mf)),
        ("Service", desired::service_name(mf)),
        ("StatefulSet", name.clone()),
        ("PodDisruptionBudget", name.clone()),
    ];
    if network_policy {
        checks.push(("NetworkPolicy", name));
    }
    for (kind, child) in checks {
        let owners = match kind {
            "ConfigMap" => owners_of::<ConfigMap>(client, ns, &child).await?,
            "Service" => owners_of::<Service>(client, ns, &child).await?,
            "StatefulSet" => owners_of::<StatefulSet>(client, ns, &child).await?,
            "NetworkPolicy" => owners_of::<NetworkPolicy>(client, ns, &child).await?,
            _ => owners_of::<PodDisruptionBudget>(client, ns, &child).await?,
        };
        if let Some(owners) = owners
            && !owners
                .iter()
                .any(|r| r.uid == uid && r.controller == Some(true))
        {
            return Ok(Some(guards::child_conflict(kind, &child, ns)));
        }
    }
    Ok(None)
}

pub fn uid_of(mf: &MirrorFlow) -> String {
    mf.meta().uid.clone().unwrap_or_default()
}

/// The owner references of the object, or `None` when there is no such object.
async fn owners_of<K>(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Option<Vec<OwnerReference>>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| o.owner_references().to_vec()))
}
