// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

func objectMeta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }
