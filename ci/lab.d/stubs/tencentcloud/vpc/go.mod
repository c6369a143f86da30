module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.20

require github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common v1.3.190
