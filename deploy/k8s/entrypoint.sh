#!/bin/bash
# Entrypoint of the inorder image.
#   executor   what Spark on Kubernetes runs in executor pods (it passes "executor" and the
#              SPARK_* variables below); starts the executor backend.
#   anything   exec'd as is (the driver Job runs spark-submit or inorder).
set -euo pipefail

if [ "${1:-}" != "executor" ]; then
  exec "$@"
fi
shift

# Spark passes the executor JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
JAVA_OPTS=()
while IFS='=' read -r name value; do
  JAVA_OPTS+=("$value")
done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)

exec "${JAVA_HOME}/bin/java" \
  "${JAVA_OPTS[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "${SPARK_HOME}/conf:${SPARK_HOME}/jars/*${SPARK_EXTRA_CLASSPATH:+:$SPARK_EXTRA_CLASSPATH}" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}" \
  "$@"
