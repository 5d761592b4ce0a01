# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
