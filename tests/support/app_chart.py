"""An application chart that depends on raftgate's chart (the sidecar helper's tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.support.chart_support import (
    CHART_DIR,
)

APP_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-app
spec:
  selector:
    matchLabels:
      app: demo
  template:
    metadata:
      labels:
        app: demo
        {{- include "raftgate.proxySidecarPodLabels" (dict "values" .Values.raftgate "context" $) | nindent 8 }}
    spec:
      securityContext:
        runAsNonRoot: true
        seccompProfile:
          type: RuntimeDefault
      automountServiceAccountToken: false
      initContainers:
        {{- include "raftgate.proxySidecar" (dict "values" .Values.raftgate "context" $) | nindent 8 }}
      containers:
        - name: app
          image: demo:1
          env:
            - name: ETCDCTL_ENDPOINTS
              value: 127.0.0.1:2379
      volumes:
        {{- include "raftgate.proxySidecarVolumes" (dict "values" .Values.raftgate "context" $) | nindent 8 }}
"""


def make_app_chart(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    (app / "templates").mkdir(parents=True)
    (app / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "app",
                "version": "1.0.0",
                "dependencies": [{"name": "raftgate", "version": "0.1.0"}],
            }
        )  # fmt: skip
    )
    (app / "values.yaml").write_text("raftgate:\n  deploy: false\n")
    (app / "templates" / "deployment.yaml").write_text(APP_DEPLOYMENT)
    shutil.copytree(CHART_DIR, app / "charts" / "raftgate")
    return app
