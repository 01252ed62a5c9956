"""The generator of the protobuf schema reads generated.proto and Go struct tags."""

from __future__ import annotations

import json
from pathlib import Path

from kubeplane.api import gen_protobuf

PROTO = """
syntax = "proto2";
package k8s.io.api.demo.v1;
message Widget {
  // +optional
  optional .k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta metadata = 1;
  optional WidgetSpec spec = 2;
}
message WidgetSpec {
  optional int32 replicas = 1;
  optional int32 minReady = 2;
  repeated string tags = 3;
  map<string, .k8s.io.apimachinery.pkg.api.resource.Quantity> limits = 4;
  optional Source source = 5;
  optional string name = 6;
  optional Common common = 7;
}
"""

GO = """
type Widget struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`
	Spec WidgetSpec `json:"spec,omitempty" protobuf:"bytes,2,opt,name=spec"`
}

type WidgetSpec struct {
	// a pointer keeps its zero value
	Replicas *int32 `json:"replicas,omitempty" protobuf:"varint,1,opt,name=replicas"`
	MinReady int32 `json:"minReadySeconds,omitempty" protobuf:"varint,2,opt,name=minReady"`
	Tags []string `json:"tags,omitempty" protobuf:"bytes,3,rep,name=tags"`
	Limits ResourceList `json:"limits,omitempty" protobuf:"bytes,4,rep,name=limits,casttype=ResourceList"`
	Source `json:",inline" protobuf:"bytes,5,opt,name=source"`
	Name string `json:"name" protobuf:"bytes,6,opt,name=name"`
	Common `json:"" protobuf:"bytes,7,req"`
}
"""


def test_parse_proto_fields_and_qualified_types() -> None:
    pkg, messages = gen_protobuf.parse_proto(PROTO)
    assert pkg == "k8s.io.api.demo.v1"
    fields = {f.name: f for f in messages["k8s.io.api.demo.v1.WidgetSpec"]}
    assert fields["limits"].label == "map" and fields["limits"].type == "k8s.io.apimachinery.pkg.api.resource.Quantity"
    assert fields["source"].type == "k8s.io.api.demo.v1.Source"
    assert fields["tags"].label == "repeated" and fields["tags"].number == 3


def test_parse_go_json_names_pointers_and_inline() -> None:
    spec = gen_protobuf.parse_go(GO)["WidgetSpec"]
    assert spec["replicas"].pointer and spec["replicas"].omitempty
    assert spec["minReady"].json == "minReadySeconds" and not spec["minReady"].pointer
    assert spec["source"].inline
    assert spec["name"].json == "name" and not spec["name"].omitempty
    # an embedded struct without a JSON name (EphemeralContainerCommon's shape) is inline
    assert spec["common"].inline


def test_data_file_is_package_data_and_covers_served_kinds() -> None:
    data = json.loads(Path(gen_protobuf.OUTPUT).read_text())
    from kubeplane.api.resources import RESOURCES

    for r in RESOURCES:
        if not {"create", "update", "patch"} & set(r.verbs):
            continue  # read-only kinds (the resource metrics) take no request bodies
        assert f"{r.api_version}/{r.kind}" in data["kinds"], r.kind
    assert data["kinds"]["*/DeleteOptions"].endswith("meta.v1.DeleteOptions")
    assert data["kinds"]["policy/v1/Eviction"] == "k8s.io.api.policy.v1.Eviction"
