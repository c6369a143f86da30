// Package errors: kubexm lab stand-in (see ../../README).
package errors

type TencentCloudSDKError struct{ Message string }

func (e *TencentCloudSDKError) Error() string { return e.Message }
