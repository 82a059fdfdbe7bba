# The runner image plus Debian's ansible-lint: what the tests lint the
# shipped roles and playbooks with (test/molecule), on the runner's own
# ansible-core. Not shipped; hack/runner-image.sh --bin builds it.
ARG RUNNER=localhost/kpssh-runner:dev
FROM ${RUNNER}
USER 0:0
ARG DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ansible-lint; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log
USER 65532:65532
CMD ["ansible-lint", "--version"]
