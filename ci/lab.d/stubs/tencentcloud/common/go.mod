module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common

go 1.20
