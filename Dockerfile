# warden's image: one static binary (CGO_ENABLED=0: no NVML probe, which
# neither the proxy nor the picker needs) on distroless's static base, run
# as its non-root user. From the repository's root:
#
#   docker build -t warden:dev .
#
# deploy/kubernetes/epp.yaml runs it as warden epp; deploy/kubernetes's
# tests check this file against the README's build line, go.mod's Go
# release and the Deployment's user.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/warden ./cmd/warden

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/warden /usr/local/bin/warden
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/warden"]
